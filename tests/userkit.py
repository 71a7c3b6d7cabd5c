"""Running this test suite's Python as another user (``nobody``, or a throwaway account), wherever the suite lives.

Tests that check what another user can or cannot do run ``python -m feiqiu_etl`` (or a small probe) as that
user with ``setpriv``. When the checkout and its virtual environment lie under a folder closed to other users (a
clone in ``/root`` or in a ``mktemp -d`` folder, as ``.ci/run`` may be started), that user cannot read them. Then
:func:`python_for` mirrors what ``feiqiu_etl`` needs to run (the package and the distributions it requires,
not the dev or Dagster extras) once per test session into a new 0755 folder in the temp dir, as hard links
(copies across file systems), runs the base interpreter with it on ``PYTHONPATH``, and removes it at the end.
Nothing here changes the mode of a folder it did not create. :func:`private_tree` lists what grants others
any access under a folder.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import feiqiu_etl

ROOT = os.geteuid() == 0
_MIRRORS: dict[str, tuple[list[str], dict[str, str]]] = {}


def private_tree(root: Path) -> list[str]:
    """Files and folders under ``root`` that grant any group or world access (``"<path> <mode>"``)."""
    loose = []
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            st = os.lstat(Path(folder) / name)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                loose.append(f"{Path(folder) / name} {stat.S_IMODE(st.st_mode):04o}")
    return loose


def as_user(name: str) -> list[str]:
    """``setpriv`` arguments that run a program as ``name`` (its own group only; root only)."""
    entry = pwd.getpwnam(name)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]


def python_for(user: str = "nobody") -> tuple[list[str], dict[str, str]]:
    """(argv prefix, extra environment) that run this suite's Python with ``feiqiu_etl`` importable as
    ``user`` (root only): ``[setpriv …, python]``, plus ``PYTHONPATH`` when a mirror was needed."""
    if user not in _MIRRORS:
        prefix = as_user(user)
        if _imports_as(prefix, [sys.executable], {}):
            _MIRRORS[user] = ([*prefix, sys.executable], {})
        else:
            python = [os.path.realpath(sys.executable)]
            env = {"PYTHONPATH": os.pathsep.join(str(p) for p in _mirror())}
            if not _imports_as(prefix, python, env):
                raise RuntimeError(f"cannot make feiqiu_etl importable for {user} (is {python[0]} closed to it?)")
            _MIRRORS[user] = ([*prefix, *python], env)
    return _MIRRORS[user]


def _imports_as(prefix: list[str], python: list[str], env: dict[str, str]) -> bool:
    probe = subprocess.run([*prefix, *python, "-c", "import feiqiu_etl.cli, psycopg"], capture_output=True,
                           cwd="/", timeout=120, env={**os.environ, **env})
    return probe.returncode == 0


_MIRROR: list[Path] = []


def _mirror() -> list[Path]:
    """The folders to put on ``PYTHONPATH``: the mirror of feiqiu_etl's source folder, then of the site
    folders of its required distributions (made once, removed at exit)."""
    if _MIRROR:
        return _MIRROR
    base = Path(tempfile.gettempdir()) / f"feiqiu-test-python-{uuid.uuid4().hex[:12]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    atexit.register(shutil.rmtree, base, True)
    source = Path(feiqiu_etl.__file__).parent
    link_tree(source, base / "src" / source.name)
    _MIRROR.append(base / "src")
    sites: dict[Path, Path] = {}
    for dist in _required_distributions("feiqiu-etl"):
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if not parts or parts[0] in ("..", feiqiu_etl.__name__):
                continue
            site = Path(str(dist.locate_file(""))).resolve()
            if site not in sites:
                sites[site] = base / f"site{len(sites)}"
                _MIRROR.append(sites[site])
            target = sites[site] / Path(str(file))
            with contextlib.suppress(FileNotFoundError):
                _link(site / Path(str(file)), target)
    return _MIRROR


def _required_distributions(name: str) -> list[importlib.metadata.Distribution]:
    """``name``'s distribution and every distribution it requires (markers evaluated with the extras asked
    for, such as ``psycopg[binary]``), once each."""
    from packaging.requirements import Requirement

    seen: dict[str, importlib.metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(name, "")]
    while todo:
        wanted, extra = todo.pop()
        key = re.sub(r"[-_.]+", "-", wanted).lower()
        if (key, extra) in done:
            continue
        done.add((key, extra))
        try:
            dist = seen.get(key) or importlib.metadata.distribution(key)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo.extend((req.name, e) for e in ["", *sorted(req.extras)])
    return list(seen.values())


def link_tree(source: Path, target: Path) -> None:
    """Mirror the files of ``source`` (no ``__pycache__``) under ``target`` with :func:`_link`."""
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = Path(folder) / name
            _link(path, target / path.relative_to(source))


def _link(source: Path, target: Path) -> None:
    """Hard-link (or copy) ``source`` to ``target``, creating 0755 folders on the way."""
    for folder in reversed([p for p in target.parents if not p.exists()]):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    if not os.stat(target).st_mode & 0o004:  # a file only its owner may read: copy it readable instead
        target.unlink()
        shutil.copyfile(source, target)
        target.chmod(0o644)
