"""Command line: ``feiqiu-etl check | run | plan | demo | runs | show | status | cancel | details | config | sql |
tasks | simulate | web | freshness | alerts test``.

Exit codes (docs/operations/troubleshooting.md lists every cause): 0 SUCCESS, 2 usage or configuration error (before any request),
3 PARTIAL, 4 FAILED, 5 CANCELLED, 6 the token's lane is held by another run, 7 the database went away
during the run, 8 stale data (``freshness --fail-stale``), 9 DEADLINE (a lane reached its ``--deadline``), 10/11/12 ``check``: a token refused, a store not
granted, the API unreachable, 130 a second Ctrl-C. With ``--json`` stdout carries exactly one JSON object; logs go to
stderr. Secrets (the API token, DB passwords) are never printed.
"""

from feiqiu_etl.cli.app import entry, main

__all__ = ["entry", "main"]
