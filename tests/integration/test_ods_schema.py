import psycopg

from feiqiu_etl.connector import load_connector
from feiqiu_etl.db.schema import ensure_ods_tables


def _columns(conn, schema, table):
    return conn.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()


def test_all_24_ods_tables_match_the_warehouse_model(pg_dsn):
    connector = load_connector()
    with psycopg.connect(pg_dsn) as conn:
        ensure_ods_tables(conn, connector.tasks)
        ensure_ods_tables(conn, connector.tasks)  # idempotent
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'ods'")}
        assert len(tables) == 24
        assert {"settlement_item", "group_package_content", "member_detail_card", "billiard_table"} <= tables
        assert _columns(conn, "ods", "settlement") == [
            ("site_id", "bigint", "NO"), ("settle_id", "bigint", "NO"),
            ("update_time", "timestamp with time zone", "YES"), ("payload", "jsonb", "NO"),
            ("content_hash", "text", "NO"), ("fetched_at", "timestamp with time zone", "NO"),
            ("run_id", "text", "NO"), ("is_deleted", "boolean", "NO"),
            ("deleted_at", "timestamp with time zone", "YES"),
        ]
        item_cols = [c[0] for c in _columns(conn, "ods", "settlement_item")]
        assert item_cols[:3] == ["site_id", "item_id", "settle_id"]
        pk = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'ods.group_package_content'::regclass "
            "AND i.indisprimary ORDER BY a.attnum").fetchall()
        assert [r[0] for r in pk] == ["site_id", "package_id", "content_id"]


def test_an_older_request_timeline_gains_the_drawn_gap_column_and_keeps_its_rows(pg_dsn):
    from feiqiu_etl.db.schema import ensure_schemas

    with psycopg.connect(pg_dsn) as conn:
        ensure_schemas(conn)
        conn.execute("ALTER TABLE etl_meta.run_request DROP COLUMN drawn")  # as an earlier version left it
        conn.execute("INSERT INTO etl_meta.run_request (run_id, lane, seq, started_at, seconds, gap, outcome) "
                     "VALUES ('r1', 'default', 1, now(), 0.05, 3.3, 'ok')")
        conn.execute("DELETE FROM etl_meta.schema_version")
        conn.commit()
        ensure_schemas(conn)
        assert ("drawn", "double precision", "YES") in _columns(conn, "etl_meta", "run_request")
        assert conn.execute("SELECT gap, drawn FROM etl_meta.run_request").fetchall() == [(3.3, None)]
        ensure_schemas(conn)  # applied once: the next command skips it
        assert conn.execute("SELECT count(*) FROM etl_meta.schema_version").fetchone()[0] == 1
