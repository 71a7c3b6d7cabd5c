import psycopg


def test_fresh_database_is_real_postgres(pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()[0]
        assert int(version) >= 130000
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'ods'").fetchone()[0] == 0
