"""ODS → DWD: SCD Type 2 dimensions and incremental facts, driven by the mapping ``feiqiu.dwd.yaml``.

Public API (warehouse-model §3–§5; spec §3.7):

* :func:`load_dwd_mapping` — load and validate a DWD mapping YAML into a :class:`DwdMapping`.
* :func:`ensure_dwd_tables` — idempotent DDL of the DWD tables and the fact watermarks.
* :class:`DwdLoadTask` — ``load(only_tables=None, serial=False) -> DwdSummary``: dimensions, then facts,
  each table on its own connection and transaction, in parallel.
"""

from feiqiu_etl.tasks.dwd.load_task import DwdLoadContext, DwdLoadTask, DwdSummary, DwdTableResult
from feiqiu_etl.connector.dwd_mapping import DwdMapping, DwdMappingError, load_dwd_mapping
from feiqiu_etl.tasks.dwd.schema import ensure_dwd_tables

__all__ = [
    "DwdLoadContext",
    "DwdLoadTask",
    "DwdMapping",
    "DwdMappingError",
    "DwdSummary",
    "DwdTableResult",
    "ensure_dwd_tables",
    "load_dwd_mapping",
]
