"""The one error of configuration."""


class ConfigError(ValueError):
    """Invalid configuration; ``str()`` is a one-line message (the CLI exits 2 before any request)."""
