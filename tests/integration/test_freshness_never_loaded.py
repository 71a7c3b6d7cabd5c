"""``freshness --fail-stale`` on a new warehouse (issue 27.4): every store the configuration names (``--site-id``,
``--fleet``) that was never loaded makes it exit 8 with one "never loaded" line per store; so does a warehouse
where nothing was ever loaded and no store is named. Real processes, real PostgreSQL."""

from __future__ import annotations

from clikit import cli
from feiqiu_etl.common import exitcodes

SITE, OTHER = 8640015201004417, 8640015201004418


def test_a_named_store_never_loaded_is_exit_8_never_loaded(pg_dsn):
    proc = cli("freshness", "--dsn", pg_dsn, "--site-id", f"{SITE},{OTHER}", "--fail-stale")
    assert proc.returncode == exitcodes.STALE, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "never loaded" in line]
    assert lines == [f"store {SITE}: never loaded (21 scheduled task(s), none finished)",
                     f"store {OTHER}: never loaded (21 scheduled task(s), none finished)"]
    assert "nothing scheduled has been loaded yet" not in proc.stdout


def test_a_fleet_store_never_loaded_is_exit_8(pg_dsn, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"lanes:\n  - name: a\n    token_env: FQ_A\n    tasks: [ODS_MEMBER]\n"
                     f"    stores: [{{site_id: {SITE}}}]\n", encoding="utf-8")
    proc = cli("freshness", "--dsn", pg_dsn, "--fleet", str(fleet), "--fail-stale")
    assert proc.returncode == exitcodes.STALE, proc.stderr
    assert f"store {SITE}: never loaded (1 scheduled task(s), none finished)" in proc.stderr


def test_nothing_loaded_and_nothing_named_is_exit_8_not_fine(pg_dsn):
    proc = cli("freshness", "--dsn", pg_dsn, "--fail-stale")
    assert proc.returncode == exitcodes.STALE, proc.stderr
    assert "never loaded: no store was ever loaded and none is named" in proc.stderr
    plain = cli("freshness", "--dsn", pg_dsn)  # without --fail-stale it only reports
    assert plain.returncode == 0, plain.stderr
