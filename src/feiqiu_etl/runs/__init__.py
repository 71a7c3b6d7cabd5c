"""Runs as records other processes can see: the registry (``etl_meta.run``/``run_log``), the cross-process
lane guard (advisory locks per token) and the control thread (heartbeat, live status, remote cancel)."""
