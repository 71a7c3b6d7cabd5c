"""How a failure is written into a run's error records: the request's parameters with secrets redacted, and
the error as one ``Type: message`` string."""

from __future__ import annotations


def safe_params(params: dict) -> dict:
    """``params`` with the values of secret-looking keys (token, password, sig, …) replaced by ``***``
    (:func:`feiqiu_etl.textsafe.redact_mapping`: the one redaction rule, issue 28 item 5)."""
    from feiqiu_etl.textsafe import redact_mapping

    return redact_mapping(params)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` (the type alone when the message is empty), as an error record stores it."""
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if str(exc) else text
