"""ODS → DWD: SCD Type 2 dimensions and incremental facts, driven by the mapping ``feiqiu.dwd.yaml``.

Public API (warehouse-model §3–§5; spec §3.7):

* :func:`load_dwd_mapping` — load and validate a DWD mapping YAML into a :class:`DwdMapping`.
* :func:`ensure_dwd_tables` — idempotent DDL of the DWD tables and the fact watermarks.
* :class:`DwdLoadTask` — ``load(only_tables=None, serial=False) -> DwdSummary``: dimensions, then facts,
  each table on its own connection and transaction, in parallel.
"""

from feiqiu_etl.common.lazyface import lazy_face

_FACE = {"DwdLoadContext": "feiqiu_etl.tasks.dwd.load_task", "DwdLoadTask": "feiqiu_etl.tasks.dwd.load_task",
         "DwdSummary": "feiqiu_etl.tasks.dwd.load_task", "DwdTableResult": "feiqiu_etl.tasks.dwd.load_task",
         "DwdMapping": "feiqiu_etl.connector.dwd_mapping", "DwdMappingError": "feiqiu_etl.connector.dwd_mapping",
         "load_dwd_mapping": "feiqiu_etl.connector.dwd_mapping", "ensure_dwd_tables": "feiqiu_etl.tasks.dwd.schema"}
"""The names of this face and their modules, imported on first use (PEP 562): ``state show`` reads the names of
the watermark tables without loading the loaders (issue 27.6)."""

__all__ = sorted(_FACE)


__getattr__ = lazy_face(__name__, _FACE, globals())
