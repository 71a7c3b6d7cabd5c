"""Shared by the benchmarks: print a report and commit-ready copy it to ``--output``."""

from __future__ import annotations

from pathlib import Path


def emit(text: str, output: Path | None) -> None:
    """Print ``text`` and, with ``output``, write it there too (folders created)."""
    print(text, end="")
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
