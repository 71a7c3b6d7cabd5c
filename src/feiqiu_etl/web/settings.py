"""The web server's settings (:class:`WebSettings`): what ``feiqiu-etl web`` builds and
:func:`feiqiu_etl.web.app.create_app` and :class:`~feiqiu_etl.web.state.AppState` read. Values only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from feiqiu_etl.registry.freshness import Schedule


@dataclass(frozen=True)
class WebSettings:
    """What the server needs. ``token`` None serves without authentication (loopback only, enforced by the
    command); ``stale_hours`` is the default freshness threshold; ``poll_interval`` the live feed's (s)."""

    dsn: str
    """The loading role's DSN: used only to write (a cancel, marking vanished runs INTERRUPTED)."""
    reader_dsn: str | None = None
    """The read-only role's DSN every page, API read and scrape uses (:mod:`.reader`; None: ``dsn``, tests)."""
    token: str | None = None
    host: str = "127.0.0.1"
    connector: str = "feiqiu"
    task_codes: tuple[str, ...] = ()
    schedule: Schedule | None = None  # from ``web --fleet``; None: every task of the connector
    stale_hours: float = 26.0
    poll_interval: float = 0.25
    run_stale_after: float = 30.0
    connect_timeout: float = 10.0
    read_timeout: float = 5.0  # s one read of a page or a scrape may wait for the server (metrics.DEFAULT_TIMEOUT)
    pool_size: int = 4
    language: str = "auto"  # web.language: auto (Accept-Language), zh-CN or en; the page's switch overrides it
    task_names: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # {code: {zh: …, en: …}} (connector)
    store_names: Mapping[int, str] = field(default_factory=dict)  # {site_id: name} from ``web --fleet``
    version: str = field(default_factory=lambda: __import__("feiqiu_etl").__version__)
