"""Shared helpers every layer may use: the status vocabulary and its table (:mod:`.status`), the exit codes
(:mod:`.exitcodes`), the lane key (:mod:`.lanes`), the YAML definition loader (:mod:`.yamldoc`).

Nothing here imports the rest of :mod:`feiqiu_etl`: this package is the bottom of the import graph."""
