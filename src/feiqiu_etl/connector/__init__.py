"""Connector definitions as data: a YAML file describes the API conventions and every task."""

from feiqiu_etl.connector.model import Connector, ConnectorError, load_connector, default_connector_path

__all__ = ["Connector", "ConnectorError", "load_connector", "default_connector_path"]
