"""WriteWorker's adaptive batches: it takes every row already queued (never more than ``batch_size``, Property 6)
and writes as soon as nothing more is queued, without waiting for ``batch_timeout``."""

from __future__ import annotations

import queue
import threading

from feiqiu_etl.pipeline.models import WriteResult
from feiqiu_etl.pipeline.write_worker import SENTINEL, RowChunk, WriteStatistics, WriteWorker


def _worker(q, batches, *, batch_size, batch_timeout=60.0, written=None):
    def write(rows):
        batches.append(list(rows))
        if written is not None:
            written.set()
        return WriteResult(inserted=len(rows))

    return WriteWorker(q, write, batch_size=batch_size, batch_timeout=batch_timeout, upstream_idle=lambda: False,
                       on_written=lambda *a: None, on_scope=lambda c: None)


def test_queued_rows_go_in_one_batch_up_to_batch_size():
    q: queue.Queue = queue.Queue()
    for n in range(4):
        q.put(RowChunk([f"r{n}a", f"r{n}b"], scope=None))
    q.put(SENTINEL)
    batches: list[list] = []
    worker = _worker(q, batches, batch_size=5)
    worker.run()
    assert [len(b) for b in batches] == [5, 3]  # 8 queued rows: a full batch, then the rest
    assert [r for b in batches for r in b] == [f"r{n}{x}" for n in range(4) for x in "ab"]
    assert worker.statistics() == WriteStatistics(batches_written=2, rows_written=8,
                                                  seconds_writing=worker.statistics().seconds_writing, rows_pending=0)


def test_a_lone_chunk_is_written_at_once_not_after_batch_timeout():
    q: queue.Queue = queue.Queue()
    batches: list[list] = []
    written = threading.Event()
    worker = _worker(q, batches, batch_size=1000, batch_timeout=60.0, written=written)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    q.put(RowChunk(["only"], scope=None))
    assert written.wait(5.0), "the chunk waited for more rows although nothing else was queued"
    q.put(SENTINEL)
    thread.join(5.0)
    assert batches == [["only"]]
