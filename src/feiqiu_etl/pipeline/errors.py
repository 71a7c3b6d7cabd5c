"""Exceptions the engine understands; everything else raised by a stage is an item-level failure."""

from __future__ import annotations


class Cancelled(Exception):
    """A wait was interrupted by the cancellation token."""


class AbortPipeline(Exception):
    """A failure that makes further requests pointless (e.g. an invalid token, upstream-api.md §2.1
    40101). The pipeline stops sending, drains what is in flight and returns status FAILED."""
