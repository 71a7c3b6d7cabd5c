"""``one_line``: the one helper that turns an exception into one line of text (log lines, records, CLI errors)."""

from __future__ import annotations

from feiqiu_etl.errortext import one_line


def test_white_space_is_folded_and_the_class_name_comes_first():
    exc = ValueError("connection failed:\n\tIs the server   running?\n")
    assert one_line(exc) == "ValueError: connection failed: Is the server running?"
    assert one_line(exc, with_type=False) == "connection failed: Is the server running?"


def test_the_text_is_cut_at_the_limit_but_never_the_class_name():
    exc = RuntimeError("x" * 500)
    assert one_line(exc) == "RuntimeError: " + "x" * 300
    assert one_line(exc, 20, with_type=False) == "x" * 20
    assert one_line(exc, None, with_type=False) == "x" * 500


def test_an_exception_without_text_is_its_class_name():
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert one_line(OSError("  \n "), with_type=False) == "OSError"
