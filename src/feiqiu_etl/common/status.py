"""The status vocabulary, ONE place: :class:`Status` names every status a run, lane, store or task can have, and
:data:`STATUSES` is the table of the final ones — exit code, meaning, how they combine (:func:`combine`).

The rules (docs "Exit codes" says the same):

* a **task**'s status is its pipeline's: FAILED (aborted) > CANCELLED > PARTIAL (some item failed) > SUCCESS;
  DEADLINE when its lane reached its deadline before the task was done (stopped, or not started). A task run in
  parts takes the worst of its parts (:func:`task_status`), DEADLINE below PARTIAL; a task of a lane another
  run holds is BUSY (it never started);
* a **store**, a **lane** and the **run** combine their parts (:func:`combine`, and
  :mod:`feiqiu_etl.runner.results` for what stops each);
* in the registry a run is also RUNNING (in progress) or INTERRUPTED (its process vanished): statuses that are no
  final outcome and have no exit code (:data:`RECORDED` lists all of them, in display order).

In general (:func:`combine`): a *dominant* status of any part (CANCELLED) is the whole's; parts that all have
one status give the whole that status; parts that all *stopped* (FAILED, BUSY: nothing loaded) give FAILED;
parts that are SUCCESS or one *success-like* status (DEADLINE) give that status; anything else is PARTIAL.
A new status is one more :class:`Status` member and one more :class:`RunStatus` entry.

A bare status literal (``"SUCCESS"``) appears only here and in SQL text (issue 26). Never imports the rest of
the package but :mod:`.exitcodes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable

from feiqiu_etl.common import exitcodes


class Status(StrEnum):
    """A status as ``etl_meta.run.status``, every summary and every JSON document spell it: a ``str`` (``Status.
    SUCCESS == "SUCCESS"``), so records written by older versions read back as the same values."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    BUSY = "BUSY"
    DEADLINE = "DEADLINE"
    INTERRUPTED = "INTERRUPTED"

    @property
    def css(self) -> str:
        """The web page's class for the status (``"success"``)."""
        return self.value.lower()


@dataclass(frozen=True)
class RunStatus:
    """One final status: its exit code, whether nothing was loaded (``stopped``: parts that all stopped make the
    whole FAILED), whether any part having it makes the whole have it (``dominant``), whether parts that are
    SUCCESS or it give it (``success_like``: nothing failed, something was left for the next run), what it
    means (docs "Exit codes") and its terminal colour (``style``, a rich style)."""

    name: Status
    exit_code: int
    stopped: bool
    dominant: bool
    meaning: str
    style: str
    success_like: bool = False


STATUSES: dict[Status, RunStatus] = {s.name: s for s in (
    RunStatus(Status.SUCCESS, exitcodes.SUCCESS, False, False, "everything planned was loaded", "green"),
    RunStatus(Status.PARTIAL, exitcodes.PARTIAL, False, False, "some items, stores or lanes failed; the rest loaded",
              "yellow"),
    RunStatus(Status.FAILED, exitcodes.FAILED, True, False, "nothing could be done", "red"),
    RunStatus(Status.CANCELLED, exitcodes.CANCELLED, False, True, "cancelled; a rerun completes it", "magenta"),
    RunStatus(Status.BUSY, exitcodes.LANE_BUSY, True, False, "not started: another run holds every lane's token",
              "blue"),
    RunStatus(Status.DEADLINE, exitcodes.DEADLINE, False, False, "stopped at the deadline: what ran is loaded, the "
                                                                 "rest is the next run's", "blue", success_like=True),
)}
"""Every final status of a run, lane, store or task."""

RECORDED: tuple[Status, ...] = (Status.RUNNING, Status.SUCCESS, Status.PARTIAL, Status.FAILED, Status.CANCELLED,
                                Status.BUSY, Status.DEADLINE, Status.INTERRUPTED)
"""What ``etl_meta.run.status`` holds: RUNNING, the final statuses of :data:`STATUSES` and INTERRUPTED."""

STYLES: dict[str, str] = {**{s: t.style for s, t in STATUSES.items()},
                          Status.RUNNING: "cyan", Status.INTERRUPTED: "red"}
"""The terminal colour of every recorded status."""

EXIT_CODES: dict[Status, int] = {name: s.exit_code for name, s in STATUSES.items()}


def exit_code(status: str) -> int:
    """The exit code of a final status; FAILED's for anything else."""
    return EXIT_CODES.get(status, exitcodes.FAILED)


def combine(statuses: Iterable[str], *, cancelled: bool = False) -> str:
    """Status of a whole from its parts' statuses (see the module docstring)."""
    parts = list(statuses)
    dominant = next((s for s in parts if s in STATUSES and STATUSES[s].dominant), None)
    if cancelled or dominant:
        return dominant or Status.CANCELLED
    if not parts:
        return Status.SUCCESS
    if len(set(parts)) == 1:
        return parts[0]
    if all(s in STATUSES and STATUSES[s].stopped for s in parts):
        return Status.FAILED
    like = {s for s in parts if s in STATUSES and STATUSES[s].success_like}
    if len(like) == 1 and all(s == Status.SUCCESS or s in like for s in parts):
        return like.pop()
    return Status.PARTIAL


def task_status(parts: Iterable[str]) -> Status:
    """Status of a task run in parts: FAILED > CANCELLED > PARTIAL > DEADLINE > SUCCESS (the worst part)."""
    order = (Status.FAILED, Status.CANCELLED, Status.PARTIAL, Status.DEADLINE)
    found = set(parts)
    return next((s for s in order if s in found), Status.SUCCESS)
