"""The lane key, ONE place: ``<connector>:<token fingerprint>`` names a token's lane across processes — the
PostgreSQL lane guard locks it (:mod:`feiqiu_etl.registry.lane_guard`), the registry records it, Dagster names its
concurrency pool after it. Never holds or shows a token: only its fingerprint (issue 26)."""

from __future__ import annotations

import hashlib


def fingerprint(secret: str) -> str:
    """First 12 hex digits of SHA-256 of ``secret``: stable, short, and useless for calling the API."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()[:12]


def lane_key(connector: str, token: str) -> str:
    """``feiqiu:99e701939941``: the connector's name and the fingerprint of the lane's token."""
    return f"{connector}:{fingerprint(token)}"


def token_part(key: str) -> str:
    """The token fingerprint of a lane key ``connector:fingerprint``."""
    return key.rsplit(":", 1)[-1]
