"""A local, deterministic implementation of the Feiqiu Open API (``shared/spec/upstream-api.md``) over real HTTP.

It serves all 21 list endpoints and 3 detail endpoints with generated store data (every field and quirk of §3),
enforces risk control (§2.2), can inject gateway and business faults (§2.1, §2.3) and records every request::

    from feiqiu_etl.simulator import Simulator, SimulatorConfig, RiskControlConfig

    cfg = SimulatorConfig(seed=7, scale="small", days=3,
                          risk=RiskControlConfig(gap_standard=0.05, gap_groupbuy=0.1))
    with Simulator(cfg) as sim:
        sim.base_url                      # "http://127.0.0.1:PORT"
        sim.dataset.records("ODS_SETTLEMENT", cfg.site_ids[0])
        sim.inject(path="/api/settlement/list", kind="http503")
        sim.request_log()
        sim.advance(hours=24)             # a day of trading and edits (also POST /__sim/advance {"hours": 24})
        sim.minimum_requests(cfg.site_ids[0], start, end)   # what a perfect connector needs (POST /__sim/minimum)

Module map: ``config`` (settings), ``catalog`` (endpoint table), ``state``/``master``/``events``/``settlement``/
``timeline`` (data generation), ``edits`` and ``dataset`` (live data and mutations), ``trading`` (time moving
forward), ``minimum`` (the requests the data needs), ``params`` (validation), ``risk`` (risk control), ``faults``
(fault injection), ``service`` (request handling), ``admin`` (the ``/__sim/`` endpoints), ``requestlog``,
``server`` (HTTP).
It is a test double: it must never bind a non-loopback address unless told to, nor print the token except in
:func:`serve_forever`.
"""

from feiqiu_etl.simulator.catalog import DETAIL_ENDPOINTS, ESCAPED_PATHS, LIST_ENDPOINTS, TASK_CODES
from feiqiu_etl.simulator.config import SCALE_PROFILES, RiskControlConfig, ScaleProfile, SimulatorConfig
from feiqiu_etl.simulator.dataset import AdvanceSummary, Dataset
from feiqiu_etl.simulator.faults import FAULT_KINDS
from feiqiu_etl.simulator.minimum import RequestMinimum, TaskMinimum
from feiqiu_etl.simulator.requestlog import RequestLogEntry
from feiqiu_etl.simulator.risk import RiskController
from feiqiu_etl.simulator.server import Simulator, serve_forever

__all__ = [
    "AdvanceSummary",
    "DETAIL_ENDPOINTS",
    "ESCAPED_PATHS",
    "FAULT_KINDS",
    "LIST_ENDPOINTS",
    "SCALE_PROFILES",
    "TASK_CODES",
    "Dataset",
    "RequestLogEntry",
    "RequestMinimum",
    "RiskControlConfig",
    "RiskController",
    "ScaleProfile",
    "Simulator",
    "SimulatorConfig",
    "TaskMinimum",
    "serve_forever",
]
