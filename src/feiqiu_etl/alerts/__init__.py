"""Alerts: tell someone when a night's run went wrong or data stopped moving (issue 18).

* :mod:`.config` — the ``alerts:`` file (``--alerts FILE`` / ``FEIQIU_ALERTS``) and ``FEIQIU_ALERT_URLS``;
* :mod:`.choice` — which configuration a run or command uses (given, none, or the environment's): owned by
  the run, never process-global;
* :mod:`.rules` — which facts raise which reason (FAILED, PARTIAL, INTERRUPTED, TIMEOUT, TOKEN_REFUSED,
  STORE_REFUSED, BANNED, CONSECUTIVE_FAILURES, STALE);
* :mod:`.messages` — the texts, in English or Chinese;
* :mod:`.sending` — Apprise under one hard time bound, with retries, secrets redacted;
* :mod:`.record` — ``etl_meta.alert``: what was sent, once per reason, subject and target;
* :mod:`.notify` — when: a run's end (:func:`after_run`), a killed run found INTERRUPTED
  (:func:`after_sweep`, :func:`sweep_and_alert`), a freshness check (:func:`after_freshness`), ``alerts test``
  (:func:`send_test`).
"""

from feiqiu_etl.common.lazyface import lazy_face

_FACE = {"ENV_FILE": ".config", "ENV_URLS": ".config", "AlertChoice": ".config", "AlertConfig": ".config",
         "AlertsConfigError": ".config", "FROM_ENVIRONMENT": ".choice", "from_environment": ".config",
         "load_alerts": ".config", "resolve": ".config",
         "after_freshness": ".notify", "after_run": ".notify", "after_sweep": ".notify", "send_test": ".notify",
         "sweep_and_alert": ".notify", "warm_up": ".notify"}
"""The names of this face and the module each comes from: imported on first use (PEP 562), so that a command
reading ``etl_meta.alert`` (:mod:`.record`) does not load the file model, Apprise's wrapper and the rules'
texts (issue 27.6: read-only commands in under a second)."""

__all__ = sorted(_FACE)


__getattr__ = lazy_face(__name__, _FACE, globals())
