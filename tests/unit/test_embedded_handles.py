"""The list of an embedded server's users (db/embedded/handles.py): a reader without the server's lock (the
watcher, ``statistics()``) must never see half a list. Fresh-user trial: the list rewritten in place read as
empty mid-write, the reader deleted it, and the watcher stopped the server under two live commands."""

from __future__ import annotations

import os
import threading

from feiqiu_etl.db.embedded.handles import HANDLE_LIST, live_users, write_users


def test_a_reader_racing_the_writer_always_sees_the_live_users_and_the_file_stays(tmp_path):
    me = os.getpid()
    stop = threading.Event()
    seen_without_me: list[list[int]] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            n = 0
            while not stop.is_set():
                n += 1
                write_users(tmp_path, [me] + ([1] if n % 2 else []))  # pid 1 lives: the list changes each time
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    write_users(tmp_path, [me])  # the list exists before the race starts, as once a server has a user
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(3000):
            users = live_users(tmp_path)
            if me not in users:
                seen_without_me.append(users)
    finally:
        stop.set()
        thread.join(10)
    assert errors == [] and seen_without_me == []
    assert (tmp_path / HANDLE_LIST).exists()
    assert list(tmp_path.glob(f"{HANDLE_LIST}.*.tmp")) == []  # no temporary file left behind
    assert oct((tmp_path / HANDLE_LIST).stat().st_mode & 0o777) == "0o600"


def test_an_unreadable_list_counts_as_no_user_is_kept_by_a_reader_and_replaced_by_the_next_write(tmp_path):
    path = tmp_path / HANDLE_LIST
    path.write_text('[12', encoding="utf-8")  # cut by a kill of an older version's writer
    assert live_users(tmp_path) == [] and path.read_text(encoding="utf-8") == "[12"  # a reader deletes nothing
    (tmp_path / f"{HANDLE_LIST}.x.tmp").write_text("[", encoding="utf-8")  # a writer killed mid-write
    write_users(tmp_path, [os.getpid()])
    assert live_users(tmp_path) == [os.getpid()] and list(tmp_path.glob("*.tmp")) == []
