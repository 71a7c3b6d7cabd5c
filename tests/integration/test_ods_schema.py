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
