"""A mistyped command names the close ones (fresh-user trial: ``feiqiu-etl rnu`` said only "No such command"),
in the top-level group, whose commands load lazily, and in the sub-groups; exit 2, one line, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from feiqiu_etl.cli.app import main


@pytest.mark.parametrize("args, hint", [
    (["rnu"], "Did you mean 'run'?"),
    (["runz"], "(Did you mean one of: 'run', 'runs'?)"),
    (["state", "rest"], "Did you mean 'reset'?"),
    (["runs", "prun"], "Did you mean 'prune'?"),
    (["config", "shwo"], "Did you mean 'show'?"),
])
def test_a_mistyped_command_names_the_close_ones(args, hint):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last == f"Error: No such command {args[-1]!r}. {hint}", result.output
    assert result.output.count("Did you mean") == 1


def test_nothing_close_is_not_guessed_and_a_real_process_says_the_same():
    result = CliRunner().invoke(main, ["zzzz"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == "Error: No such command 'zzzz'."
    proc = subprocess.run([sys.executable, "-m", "feiqiu_etl", "rnu"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.strip().splitlines()[-1] == "Error: No such command 'rnu'. Did you mean 'run'?", proc.stderr
    assert "Traceback" not in proc.stderr
