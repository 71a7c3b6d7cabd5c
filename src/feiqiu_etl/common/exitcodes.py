"""Exit codes of every command (docs/reference/exit-codes.md lists them, docs/operations/troubleshooting.md
gives every cause of each)."""

SUCCESS = 0
USAGE = 2            # a usage or configuration error, reported in one line before any request
PARTIAL = 3          # some items failed and were recorded; everything else is loaded
FAILED = 4           # aborted: invalid token, every store refused, upstream unreachable, ...
CANCELLED = 5        # Ctrl-C, SIGTERM, --timeout or feiqiu-etl cancel; a rerun completes the work
LANE_BUSY = 6        # status BUSY: every lane of the run is held by another process (same token, same database)
DATABASE_LOST = 7    # the database went away during the run and did not come back in time
STALE = 8            # freshness --fail-stale: some scheduled store/task is older than the threshold
DEADLINE = 9         # a lane reached its --deadline: what ran is loaded, the rest is the next run's
HARD_ABORT = 130     # a second Ctrl-C/SIGTERM: stopped at once

# the exit code of each run status: feiqiu_etl.common.status.STATUSES

# feiqiu-etl check (issue 27): what a run would meet, each its own code
CHECK_TOKEN = 10        # check: a token was refused (40101: invalid or expired)
CHECK_STORE = 11        # check: a store is not granted to its token (40103)
CHECK_UNREACHABLE = 12  # check: the API base URL did not answer (refused, DNS, connect timeout)
