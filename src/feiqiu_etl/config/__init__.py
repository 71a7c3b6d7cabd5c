"""The settings of feiqiu-etl: one typed model built from layers (:mod:`.settings`), ``.env`` files
(:mod:`.dotenv`) and the one configuration error."""

from feiqiu_etl.config.dotenv import DotEnv, load_env_file, read_dotenv
from feiqiu_etl.config.errors import ConfigError
from feiqiu_etl.config.settings import Settings, Source, load_settings

__all__ = ["ConfigError", "DotEnv", "Settings", "Source", "load_env_file", "load_settings", "read_dotenv"]
