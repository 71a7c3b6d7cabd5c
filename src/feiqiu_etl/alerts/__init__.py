"""Alerts: tell someone when a night's run went wrong or data stopped moving (issue 18).

* :mod:`.config` — the ``alerts:`` file (``--alerts FILE`` / ``FEIQIU_ALERTS``) and ``FEIQIU_ALERT_URLS``;
* :mod:`.rules` — which facts raise which reason (FAILED, PARTIAL, INTERRUPTED, TIMEOUT, TOKEN_REFUSED,
  STORE_REFUSED, BANNED, CONSECUTIVE_FAILURES, STALE);
* :mod:`.messages` — the texts, in English or Chinese;
* :mod:`.sending` — Apprise under one hard time bound, with retries, secrets redacted;
* :mod:`.record` — ``etl_meta.alert``: what was sent, once per reason, subject and target;
* :mod:`.notify` — when: a run's end (:func:`after_run`), a killed run found INTERRUPTED
  (:func:`after_sweep`, :func:`sweep_and_alert`), a freshness check (:func:`after_freshness`), ``alerts test``
  (:func:`send_test`).
"""

from feiqiu_etl.alerts.config import (ENV_FILE, ENV_URLS, AlertConfig, AlertsConfigError, activate, active,
                                      load_alerts, reset)
from feiqiu_etl.alerts.notify import (after_freshness, after_run, after_sweep, send_test, sweep_and_alert,
                                      warm_up)

__all__ = ["ENV_FILE", "ENV_URLS", "AlertConfig", "AlertsConfigError", "activate", "active", "after_freshness",
           "after_run", "after_sweep", "load_alerts", "reset", "send_test", "sweep_and_alert",
           "warm_up"]
