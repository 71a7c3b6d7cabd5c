"""``.env`` files: read with python-dotenv into the environment without overriding what is already set, and
refused in one line when they cannot be right (unparsable line, not UTF-8, over 1 MiB, a NUL byte, a value over
32 KiB). :class:`DotEnv` records which names a file set and on which line, for the settings model
(:mod:`feiqiu_etl.config.settings`): an unknown setting in a ``.env`` is an error, one in the real environment
may belong to other software and is ignored. A name set twice in one file is no error (python-dotenv takes the
last one) but one warning line, which the settings model logs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import MutableMapping

from feiqiu_etl.config.errors import ConfigError

MAX_ENV_BYTES = 2**20
"""Largest ``.env`` file read (bytes); python-dotenv parses a huge one for minutes without a word."""


@dataclass(frozen=True)
class DotEnv:
    """What ``.env`` files put into the environment: ``defined``, every name they set (an unknown setting among
    them is an error), and ``applied``, those the real environment did not already hold (their value came
    from the file: its source is ``.env``; the others' is ``environment``); ``lines``, ``(name, "file:line")``
    of the line whose value counts; ``repeats``, one warning line per name a file sets more than once."""

    defined: frozenset[str] = frozenset()
    applied: frozenset[str] = frozenset()
    lines: tuple[tuple[str, str], ...] = ()
    repeats: tuple[str, ...] = ()

    def __or__(self, other: "DotEnv") -> "DotEnv":
        """Both files' names; a name in both is the first file's (the second cannot override it)."""
        first = dict(self.lines)
        return DotEnv(self.defined | other.defined, self.applied | other.applied,
                      self.lines + tuple((n, w) for n, w in other.lines if n not in first),
                      self.repeats + other.repeats)

    def where(self, name: str) -> str:
        """``file:line`` of ``name``'s line (``.env`` when unknown)."""
        return dict(self.lines).get(name, ".env")


def read_dotenv(path: str | Path = ".env", environ: MutableMapping[str, str] | None = None, *,
                required: bool = False) -> DotEnv:
    """:func:`load_env_file`, and which of its names it applied. Raises :class:`ConfigError` (one line)."""
    target = os.environ if environ is None else environ
    before = set(target)
    names = load_env_file(path, target, required=required)
    if not names:
        return DotEnv()
    found = name_lines(Path(path))
    lines = tuple((name, f"{path}:{numbers[-1]}") for name, numbers in found.items())
    return DotEnv(frozenset(names), frozenset(names - before), lines, _repeats(Path(path), found))


def name_lines(path: Path) -> dict[str, list[int]]:
    """``{name: [line, …]}``: the 1-based lines of a (valid, UTF-8) ``.env`` file that set each name, in file
    order, from python-dotenv's own parser (a quoted value may span lines)."""
    import io

    from dotenv.parser import parse_stream

    found: dict[str, list[int]] = {}
    for binding in parse_stream(io.StringIO(path.read_text(encoding="utf-8"))):
        if binding.key is not None and not binding.error:
            text = binding.original.string
            blank = text[:len(text) - len(text.lstrip())].count("\n")  # blank lines before it are its mark
            found.setdefault(binding.key, []).append(binding.original.line + blank)
    return found


def _repeats(path: Path, found: dict[str, list[int]]) -> tuple[str, ...]:
    """One line per name set more than once: where, and which line wins (python-dotenv: the last)."""
    return tuple(f"{path}:{numbers[-1]}: {_shown(name)} is set {len(numbers)} times (lines "
                 f"{', '.join(map(str, numbers))}); the last one, line {numbers[-1]}, wins"
                 for name, numbers in found.items() if len(numbers) > 1)


def _shown(name: str) -> str:
    """A variable name fit for one log line (escaped, at most 80 characters)."""
    return name.encode("unicode_escape").decode()[:80]


def load_env_file(path: str | Path = ".env", environ: MutableMapping[str, str] | None = None, *,
                  required: bool = False) -> set[str]:
    """Load ``path`` (if it exists) into ``environ`` (default ``os.environ``) without overriding what is
    already set. Returns the names the file defines. Raises :class:`ConfigError` (one line) for a line
    python-dotenv cannot parse, a file that is not UTF-8, or a missing file when ``required``."""
    import logging

    from dotenv import dotenv_values

    target = os.environ if environ is None else environ
    p = Path(path)
    if not p.is_file():
        if required:
            raise ConfigError(f"{p}: {'not a regular file' if p.exists() else 'no such env file'}")
        return set()
    if p.stat().st_size > MAX_ENV_BYTES:
        raise ConfigError(f"{p}: {p.stat().st_size:,} bytes, more than the {MAX_ENV_BYTES // 2**20} MiB an env "
                          "file may have")
    problems: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            problems.append(record.getMessage())

    logger = logging.getLogger("dotenv.main")
    handler, propagate = _Catch(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        values = dotenv_values(p, encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    if problems:
        raise ConfigError(f"{p}: {problems[0].rstrip('.')}")
    for name, value in values.items():
        _check_env_entry(p, name, value)
    for name, value in values.items():
        if value is not None and name not in target:
            target[name] = value
    return set(values)


#: Longest value a ``.env`` line may set, characters. Real settings are short; a child process cannot even
#: receive a variable above 128 KiB (Linux MAX_ARG_STRLEN), so a huge value is a mistake in the file.
MAX_ENV_VALUE = 32 * 1024


def _check_env_entry(path: Path, name: str, value: str | None) -> None:
    """Raise :class:`ConfigError` (naming the file and the variable, never the value) for a name or value
    the environment cannot hold: a NUL byte, ``=`` or an empty name, or a value above :data:`MAX_ENV_VALUE`."""
    shown = name.replace("\0", "\\0")[:80]
    if not name or "\0" in name or "=" in name:
        raise ConfigError(f"{path}: '{shown}' is not a valid variable name")
    if value is None:
        return
    if "\0" in value:
        raise ConfigError(f"{path}: the value of {shown} holds a NUL byte")
    if len(value) > MAX_ENV_VALUE:
        raise ConfigError(f"{path}: the value of {shown} is {len(value):,} characters long; at most "
                          f"{MAX_ENV_VALUE:,} are allowed")
