"""feiqiu-etl: pull the Feiqiu store-management API through one rate-limited request lane into PostgreSQL.

Layers: ``pipeline`` (generic engine, knows nothing of Feiqiu), ``api`` (HTTP client), ``connector``
(declarative endpoint/task definitions), ``tasks.ods`` / ``tasks.dwd`` (loaders), ``db`` (PostgreSQL),
``simulator`` (a local implementation of upstream-api.md).
"""

__version__ = "0.1.0"
