"""Application configuration: layered key/value settings (defaults < environment/.env < CLI)."""

from feiqiu_etl.config.app_config import AppConfig, ConfigError

__all__ = ["AppConfig", "ConfigError"]
