"""``.env`` files: read with python-dotenv into the environment without overriding what is already set, and
refused in one line when they cannot be right (unparsable line, not UTF-8, over 1 MiB, a NUL byte, a value over
32 KiB). :class:`DotEnv` records which names a file set, for the settings model
(:mod:`feiqiu_etl.config.settings`): an unknown setting in a ``.env`` is an error, one in the real environment
may belong to other software and is ignored.
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
    from the file: its source is ``.env``; the others' is ``environment``)."""

    defined: frozenset[str] = frozenset()
    applied: frozenset[str] = frozenset()

    def __or__(self, other: "DotEnv") -> "DotEnv":
        return DotEnv(self.defined | other.defined, self.applied | other.applied)


def read_dotenv(path: str | Path = ".env", environ: MutableMapping[str, str] | None = None, *,
                required: bool = False) -> DotEnv:
    """:func:`load_env_file`, and which of its names it applied. Raises :class:`ConfigError` (one line)."""
    target = os.environ if environ is None else environ
    before = set(target)
    names = load_env_file(path, target, required=required)
    return DotEnv(frozenset(names), frozenset(names - before))


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
