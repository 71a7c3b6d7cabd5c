"""Which alert configuration a run or a command uses, named without loading the configuration's model:
an :class:`~feiqiu_etl.alerts.config.AlertConfig`, None (no alerts), or :data:`FROM_ENVIRONMENT` — the
environment's (the ``FEIQIU_ALERTS`` file and ``FEIQIU_ALERT_URLS``), read when the choice is resolved
(:func:`feiqiu_etl.alerts.config.resolve`). The run owns its choice (``RunRequest.alerts``), so two runs in one
process never see each other's configuration; nothing here is process-global."""

from __future__ import annotations


class FromEnvironment:
    """The type of :data:`FROM_ENVIRONMENT` (one instance)."""

    def __repr__(self) -> str:
        return "FROM_ENVIRONMENT"


FROM_ENVIRONMENT = FromEnvironment()
"""The alert configuration of a run or a command that was given none: the environment's, read when resolved.
What every entry point that takes an ``AlertChoice`` defaults to; an explicit ``None`` means no alerts."""
