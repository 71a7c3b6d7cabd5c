"""The application layer: what every surface (the CLI, the web page, Dagster, the tests) asks of the product.
Read-side queries that return frozen records (:mod:`.reads`). No click, no signals, no terminal rendering here:
those stay in :mod:`feiqiu_etl.cli`."""
