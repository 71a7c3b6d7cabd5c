"""Connector definitions as data: a YAML file describes the API conventions and every task.

The names below load :mod:`feiqiu_etl.connector.model` (pydantic, PyYAML) when first used, not when a sibling
module (``windows``, ``spec``) is imported: a read-only command that only formats a window never pays for them."""

__all__ = ["Connector", "ConnectorError", "load_connector", "default_connector_path"]


def __getattr__(name: str):
    if name in __all__:
        from feiqiu_etl.connector import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
