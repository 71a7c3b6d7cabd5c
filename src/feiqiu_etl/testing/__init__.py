"""Test support that ships with the package: the oracles the tests and benchmarks compare the engine against
(:mod:`.serial_reference`). The product never imports it (tests/unit/test_architecture.py)."""
