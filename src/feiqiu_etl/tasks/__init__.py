"""Loaders on top of the engine: ``tasks.ods`` (API → ODS) and ``tasks.dwd`` (ODS → DWD)."""
