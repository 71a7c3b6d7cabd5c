"""Property 15 (spec §5): a ``TaskLogBuffer`` flush holds only its own task's entries, oldest first.

Several tasks log at the same time (some from two threads, some through a ``logging.Logger`` routed into
the buffer by ``TaskLogHandler``), all into buffers that share one parent logger. The injected clock
hands out drawn timestamps — out of order and with ties — so the sort is really exercised. Then all
buffers flush concurrently and the parent's records are checked task by task.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from feiqiu_etl.pipeline.log_buffer import TaskLogBuffer

T0 = datetime(2026, 1, 1, 8, 0, 0)
LEVELS = st.sampled_from([logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR])
LINE = st.tuples(LEVELS, st.integers(0, 5), st.booleans())  # level, timestamp offset (s), via logger?


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def clock(offsets: list[int]):
    """A time source handing out ``T0 + offset`` in call order (the buffer calls it under its lock)."""
    it = iter(offsets)
    return lambda: T0 + timedelta(seconds=next(it))


# Feature: etl-unified-pipeline, Property 15: 日志缓冲区按任务隔离
@given(tasks=st.lists(st.tuples(st.lists(LINE, max_size=12), st.integers(1, 2)), min_size=1, max_size=4))
def test_p15_flush_outputs_only_its_task_in_timestamp_order(tasks):
    parent = logging.getLogger(f"tests.p15.{uuid.uuid4().hex}")
    parent.setLevel(logging.DEBUG)
    parent.propagate = False
    capture = Capture()
    parent.addHandler(capture)
    codes = [f"ODS_T{i}" for i in range(len(tasks))]
    buffers, loggers = [], []
    for code, (lines, _) in zip(codes, tasks):
        # timestamps are handed out in logging order; each thread's lines get a known message
        buffers.append(TaskLogBuffer(code, parent, now=clock([off for _, off, _ in lines])))
        task_logger = logging.getLogger(f"tests.p15.task.{uuid.uuid4().hex}")
        task_logger.setLevel(logging.DEBUG)
        task_logger.propagate = False
        task_logger.addHandler(buffers[-1].handler())
        loggers.append(task_logger)

    def emit(t: int, thread: int, lines: list) -> None:
        for i, (level, _, via_logger) in enumerate(lines):
            if via_logger:
                loggers[t].log(level, "line %s.%s.%s", t, thread, i)
            else:
                buffers[t].log(level, "line %s.%s.%s", t, thread, i)

    threads = []
    for t, (lines, n_threads) in enumerate(tasks):
        for k in range(n_threads):
            threads.append(threading.Thread(target=emit, args=(t, k, lines[k::n_threads])))
    flushed: dict[int, list] = {}
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    flushers = [threading.Thread(target=lambda t=t: flushed.__setitem__(t, buffers[t].flush()))
                for t in range(len(tasks))]
    for th in flushers:
        th.start()
    for th in flushers:
        th.join()

    out = [(r.args[0], r.args[1], r.levelno) for r in capture.records]
    for t, code in enumerate(codes):
        entries = flushed[t]
        lines, n_threads = tasks[t]
        # only this task's entries, all of them, each once
        assert all(e.task_code == code for e in entries)
        assert len(entries) == len(lines)
        assert Counter(e.message.split(".")[0] for e in entries) == Counter({f"line {t}": len(lines)} if lines else {})
        # oldest first; equal timestamps keep each thread's logging order
        assert [e.timestamp for e in entries] == sorted(e.timestamp for e in entries)
        assert sorted(e.timestamp for e in entries) == sorted(T0 + timedelta(seconds=o) for _, o, _ in lines)
        for k in range(n_threads):
            mine = [int(e.message.split(".")[2]) for e in entries if e.message.split(".")[1] == str(k)]
            stamps = {int(e.message.split(".")[2]): e.timestamp for e in entries if e.message.split(".")[1] == str(k)}
            assert all(stamps[a] < stamps[b] for a, b in zip(mine, mine[1:]) if a > b)
        # the parent got exactly these, prefixed with the code, in the same order, as one block
        block = [i for i, (c, _, _) in enumerate(out) if c == code]
        assert block == list(range(block[0], block[0] + len(block))) if block else not entries
        assert [(m, lvl) for c, m, lvl in out if c == code] == [(e.message, e.level) for e in entries]
        assert buffers[t].flush() == []
    assert Counter(c for c, _, _ in out) == +Counter({code: len(tasks[t][0]) for t, code in enumerate(codes)})
    assert all(r.getMessage().startswith(f"[{r.args[0]}] ") for r in capture.records)
