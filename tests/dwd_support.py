"""Test helpers for the DWD layer: realistic ODS payloads (upstream-api.md §4, §5.2) and direct ODS writes.

``payload(source, n, **overrides)`` builds the n-th record of an ODS source table with the API's quirks:
money as strings (``"57.5"``), ids above 2^53, ``""`` for none, ``0`` references, nested objects and arrays.
``Ods(conn)`` writes ODS rows exactly as warehouse-model §2.2 stores them (key columns from the connector,
window column, payload, canonical-JSON SHA-256 ``content_hash``). ``scd2_violations`` checks the invariants
of warehouse-model §4.3 that hold for any dimension. Used by integration, property tests and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from psycopg import sql
from psycopg.types.json import Jsonb

from feiqiu_etl.connector import load_connector
from feiqiu_etl.connector.spec import KeyColumn

SITE = 8640015201004417
SITE2 = 8640015201009999
BIG = 1872950412356812801  # > 2**53: a float round trip would turn it into ...800
CST = timezone(timedelta(hours=8))
T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
OPEN_END = datetime(9999, 12, 31, tzinfo=CST)


def at(seconds: float) -> datetime:
    """A fixed, increasing timestamp: ``T0 + seconds``."""
    return T0 + timedelta(seconds=seconds)


def _member(n: int) -> dict:
    return {"memberId": BIG + n, "siteId": SITE, "memberNo": f"{n:06d}", "name": "", "nickname": f"球友{n}🎱",
            "mobile": "138****5678", "gender": n % 3, "status": 1, "birthday": "" if n % 2 else "1990-05-17",
            "level": {"levelId": 2, "levelName": "金卡", "discountRate": "0.88"}, "points": 120 + n,
            "tags": ["夜场常客"], "registerSource": "MINIAPP", "referrerId": 0 if n % 2 else BIG + 900,
            "createTime": "2023-06-01 10:00:00", "updateTime": "2024-02-01 09:30:00"}


def _member_card(n: int) -> dict:
    return {"cardId": f"{8801234 + n:010d}", "siteId": SITE, "memberId": BIG + n, "cardTypeId": 3,
            "cardTypeName": "充500送100储值卡", "cardKind": "STORED_VALUE", "balance": "320.5", "giftBalance": "40.00",
            "discountRate": "0.88", "remainingTimes": "", "status": 1, "isDefault": 1, "expireDate": "",
            "openTime": "2023-06-01 10:05:00", "updateTime": "2024-02-28 21:00:00"}


def _billiard_table(n: int) -> dict:
    return {"tableId": n, "siteId": SITE, "tableName": f"A{n:02d}", "areaId": 1, "tableType": "CN8",
            "priceRuleName": "标准计费", "unitPrice": "48.00", "sortNo": n, "enabled": 1, "currentStatus": "IDLE",
            "updateTime": "2024-01-05 08:00:00"}


def _table_area(n: int) -> dict:
    return {"areaId": n, "siteId": SITE, "areaName": "大厅" if n == 1 else f"VIP包厢区{n}", "remark": "",
            "sortNo": n, "tableCount": 12, "enabled": 1, "updateTime": "2024-01-05 08:00:00"}


def _goods(n: int) -> dict:
    return {"goodsId": str(100230 + n), "siteId": SITE, "goodsName": "红牛🐂 250ml", "categoryId": 1,
            "barcode": "6920202888883", "unit": "瓶", "salePrice": "8.00", "memberPrice": "", "costPrice": 2.3,
            "stockQty": 48, "isOnSale": 1, "specs": [], "createTime": "2023-05-01 10:00:00",
            "updateTime": "2024-01-10 10:00:00"}


def _goods_category(n: int) -> dict:
    return {"categoryId": n, "siteId": SITE, "categoryName": "饮料", "parentId": 0 if n == 1 else 1,
            "level": 1 if n == 1 else 2, "sortNo": n, "enabled": 1, "updateTime": "2024-01-05 08:00:00"}


def _assistant(n: int) -> dict:
    return {"assistantId": f"AS{n:04d}", "siteId": SITE, "assistantNo": f"{n:03d}", "name": f"小雅{n}",
            "gender": 2, "mobile": "139****1234", "levelName": "金牌", "hourlyPrice": "120.00",
            "skills": ["中式八球", "斯诺克"], "status": "ACTIVE", "onShift": 0, "entryDate": "2023-03-15",
            "avatarUrl": "https://img.example/a.png", "updateTime": "2024-01-05 08:00:00"}


def _group_package(n: int) -> dict:
    return {"packageId": f"PKG2023110000{n:02d}", "siteId": SITE, "platform": "DOUYIN",
            "platformDealId": "7318822645190010890", "packageName": "🎱夜场双人套餐 3小时+2瓶饮料",
            "packageType": "TABLE_GOODS", "salePrice": "88", "originalPrice": "160.00", "durationMinutes": 180,
            "saleStartDate": "2024-01-10", "saleEndDate": "", "usableWeekdays": [1, 2, 3, 4, 5, 6, 7],
            "usableTimeRange": "18:00-02:00", "status": "ON_SALE", "createTime": "2024-01-10 11:03:27",
            "updateTime": "2024-01-10 11:03:27"}


def _settlement(n: int) -> dict:
    return {"settleId": BIG + n, "siteId": SITE, "settleNo": f"JZ2403010000{n:02d}", "tableIds": [7, 8],
            "memberId": 0, "memberCardId": "", "tableAmount": "57.5", "goodsAmount": "0", "assistantAmount": "0.00",
            "receivableAmount": "57.50", "discountAmount": "0.00", "roundingAmount": "0.50", "paidAmount": "57.00",
            "payMethods": [{"payMethod": "GROUPBUY", "amount": "39.90"}, {"payMethod": "ALIPAY", "amount": "17.10"}],
            "status": 1, "cashierId": 12, "cashierName": "前台-小周", "guestCount": 3, "remark": "客人说下次还来🎱",
            "createTime": "2024-03-01 20:15:40", "settleTime": "2024-03-01 21:48:02",
            "updateTime": "2024-03-01 21:48:02"}


def _settlement_item(n: int) -> dict:
    return {"itemId": BIG + 100 + n, "settleId": BIG + 1, "siteId": SITE, "itemType": "DISCOUNT", "refId": "",
            "itemName": "会员88折（台费）", "qty": 1, "unitPrice": "", "amount": "-11.52",
            "discountSource": "MEMBER_DISCOUNT", "payMethod": "", "sortNo": n}


def _table_use(n: int) -> dict:
    return {"useId": BIG + 200 + n, "siteId": SITE, "tableId": 3, "tableName": "A03", "areaId": 1, "settleId": 0,
            "memberId": BIG + 1, "beginTime": "2024-03-01 19:02:11", "finishTime": "", "billedMinutes": 120,
            "pausedMinutes": 0, "pricing": {"ruleName": "标准计费", "unitPrice": "48.00", "billingUnitMinutes": 30,
                                            "minCharge": "24"},
            "amount": "96.00", "status": "PLAYING", "openOperator": "前台-小周", "updateTime": "2024-03-01 19:02:11"}


def _goods_sale(n: int) -> dict:
    return {"lineId": BIG + 300 + n, "siteId": SITE, "settleId": 0, "useId": BIG + 201, "memberId": 0,
            "goodsId": "100234", "goodsName": "红牛🐂 250ml", "categoryId": 1, "qty": 2, "unitPrice": "8.00",
            "amount": "16.00", "discountAmount": "0", "isGift": 0, "status": "NORMAL", "operatorName": "吧台-阿杰",
            "createTime": "2024-03-01 19:30:00"}


def _assistant_service(n: int) -> dict:
    return {"serviceId": BIG + 400 + n, "siteId": SITE, "assistantId": "AS0017", "assistantName": "小雅（金牌）",
            "tableId": 3, "useId": BIG + 201, "settleId": 0, "memberId": 0, "serviceType": "ACCOMPANY",
            "beginTime": "2024-03-01 19:10:00", "finishTime": "", "serviceMinutes": 60, "unitPrice": "120.00",
            "amount": "120.00", "isExtension": 0, "status": "SERVING", "updateTime": "2024-03-01 19:10:00"}


def _payment(n: int) -> dict:
    return {"payId": BIG + 500 + n, "siteId": SITE, "payNo": f"PAY2403010000{n:02d}", "channelTradeNo": "",
            "bizType": "SETTLEMENT", "bizId": str(BIG + 1), "payMethod": "MEMBER_CARD", "amount": "150.00",
            "memberId": BIG + 1, "cardId": "0008801234", "status": "SUCCESS", "cashierName": "前台-小周",
            "createTime": "2024-03-01 21:10:00", "payTime": "2024-03-01 21:10:37"}


def _refund(n: int) -> dict:
    return {"refundId": BIG + 600 + n, "siteId": SITE, "refundNo": f"TK24030100{n:02d}", "payId": BIG + 501,
            "bizType": "SETTLEMENT", "bizId": str(BIG + 1), "payMethod": "WECHAT", "amount": "17.10",
            "reason": "重复支付", "status": "PROCESSING", "operatorName": "店长", "refundTime": "2024-03-01 22:00:00",
            "finishTime": ""}


def _group_verification(n: int) -> dict:
    return {"verifyId": BIG + 700 + n, "siteId": SITE, "platform": "DOUYIN", "receiptCode": "1234****5678",
            "certificateId": "7318822645190011234", "platformOrderId": "1093847561029384756",
            "packageId": "PKG202311000017", "packageName": "【工作日】中式台球畅打2小时", "settleId": BIG + 1,
            "memberId": 0, "salePrice": "39.90", "merchantReceivable": "37.5", "status": "VERIFIED",
            "revokeTime": "", "operatorName": "前台-小周", "extra": {"poiId": "6601", "skuId": "1777"},
            "verifyTime": "2024-03-01 20:00:00"}


BUILDERS: dict[str, Callable[[int], dict]] = {
    "ods.member": _member, "ods.member_card": _member_card, "ods.billiard_table": _billiard_table,
    "ods.table_area": _table_area, "ods.goods": _goods, "ods.goods_category": _goods_category,
    "ods.assistant": _assistant, "ods.group_package": _group_package, "ods.settlement": _settlement,
    "ods.settlement_item": _settlement_item, "ods.table_use": _table_use, "ods.goods_sale": _goods_sale,
    "ods.assistant_service": _assistant_service, "ods.payment": _payment, "ods.refund": _refund,
    "ods.group_verification": _group_verification,
}


def payload(source: str, n: int = 1, **overrides: Any) -> dict:
    """The n-th realistic record of ODS table ``source`` (n >= 1), with ``overrides`` applied."""
    record = BUILDERS[source](n)
    record.update(overrides)
    return record


def content_hash(record: dict) -> str:
    """SHA-256 of the canonical JSON (warehouse-model §2.2): sorted keys, no whitespace, UTF-8 unescaped."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class OdsLayout:
    """Where a record goes in its ODS table: primary-key columns (after ``site_id``), other NOT NULL key
    columns (a detail row's parent), and the window field/column of windowed tables."""

    pk: tuple[KeyColumn, ...]
    extra: tuple[KeyColumn, ...] = ()
    window_field: str | None = None
    window_column: str | None = None


def ods_layouts() -> dict[str, OdsLayout]:
    """Every ODS table of the bundled connector → its :class:`OdsLayout`."""
    layout = {}
    for spec in load_connector().tasks:
        layout[spec.table] = OdsLayout(spec.keys, (), spec.window_field, spec.window_column)
        if spec.detail:
            d = spec.detail
            layout[d.target_table] = OdsLayout(d.keys, () if d.parent_is_key else (d.parent,))
    return layout


class Ods:
    """Writes ODS rows directly, as the ODS loader would store them (warehouse-model §2.2–§2.3)."""

    def __init__(self, conn):
        self.conn = conn
        self.layout = ods_layouts()

    def key_of(self, table: str, record: dict) -> tuple:
        return tuple(k.convert(record[k.field]) for k in self.layout[table].pk)

    def put(self, table: str, record: dict, *, fetched_at: datetime, run_id: str = "r-test",
            is_deleted: bool = False, deleted_at: datetime | None = None, key: tuple | None = None) -> None:
        """Upsert one ODS row for ``record``; ``key`` overrides the primary-key values (to make duplicate BKs)."""
        lay = self.layout[table]
        values: dict[str, Any] = {"site_id": record.get("siteId", SITE)}
        values.update((k.column, v) for k, v in zip(lay.pk, key or self.key_of(table, record)))
        values.update((k.column, k.convert(record[k.field])) for k in lay.extra)
        if lay.window_column:
            raw = record.get(lay.window_field) or None
            values[lay.window_column] = datetime.fromisoformat(raw).replace(tzinfo=CST) if raw else None
        values.update(payload=Jsonb(record), content_hash=content_hash(record), fetched_at=fetched_at,
                      run_id=run_id, is_deleted=is_deleted, deleted_at=deleted_at)
        pk = ["site_id", *(k.column for k in lay.pk)]
        stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}").format(
            sql.Identifier(*table.split(".")), sql.SQL(", ").join(map(sql.Identifier, values)),
            sql.SQL(", ").join(sql.Placeholder() * len(values)), sql.SQL(", ").join(map(sql.Identifier, pk)),
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in values if c not in pk),
        )
        self.conn.execute(stmt, list(values.values()))

    def soft_delete(self, table: str, record: dict, *, at_: datetime, key: tuple | None = None) -> None:
        """Mark the row of ``record`` deleted (payload untouched), as a complete snapshot would."""
        cond = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k.column))
                                     for k in self.layout[table].pk)
        self.conn.execute(
            sql.SQL("UPDATE {} SET is_deleted = true, deleted_at = %s WHERE site_id = %s AND {}").format(
                sql.Identifier(*table.split(".")), cond),
            [at_, record.get("siteId", SITE), *(key or self.key_of(table, record))],
        )


# -------------------------------------------------------------------------------------- SCD2 invariants


def scd2_violations(conn, table: str, bk: list[str]) -> list[str]:
    """Violations of warehouse-model §4.3 rules 1 and 2 (structure) in ``dwd.<table>``; empty when it holds.

    Rule 1: at most one current row per BK, ``is_current`` exactly when ``valid_to`` is the open end.
    Rule 2: half-open versions of one BK never overlap, ``valid_from < valid_to``, ``version_no`` runs 1, 2, …
    in ``valid_from`` order, and consecutive versions meet or leave a gap (gaps only after a deletion, which
    the callers check against their model).
    """
    ident = sql.Identifier("dwd", table)
    keys = sql.SQL(", ").join(map(sql.Identifier, ["site_id", *bk]))
    checks = {
        "two current rows for one key": sql.SQL(
            "SELECT {k} FROM {t} WHERE is_current GROUP BY {k} HAVING count(*) > 1"),
        "is_current disagrees with valid_to": sql.SQL(
            "SELECT {k} FROM {t} WHERE is_current <> (valid_to = %(open)s)"),
        "empty or reversed interval": sql.SQL("SELECT {k} FROM {t} WHERE valid_from >= valid_to"),
        "overlapping versions": sql.SQL(
            "SELECT {k} FROM (SELECT {k}, valid_from, lag(valid_to) OVER w AS prev_to FROM {t}"
            " WINDOW w AS (PARTITION BY {k} ORDER BY valid_from)) x WHERE prev_to > valid_from"),
        "version_no not 1..n in time order": sql.SQL(
            "SELECT {k} FROM (SELECT {k}, version_no, row_number() OVER w AS rn FROM {t}"
            " WINDOW w AS (PARTITION BY {k} ORDER BY valid_from)) x WHERE version_no <> rn"),
        "current row is not the latest version": sql.SQL(
            "SELECT {k} FROM (SELECT {k}, is_current, row_number() OVER w AS rn FROM {t}"
            " WINDOW w AS (PARTITION BY {k} ORDER BY valid_from DESC)) x WHERE is_current AND rn <> 1"),
    }
    problems = []
    for what, q in checks.items():
        rows = conn.execute(q.format(k=keys, t=ident), {"open": OPEN_END}).fetchall()
        if rows:
            problems.append(f"{table}: {what}: {rows[:3]}")
    return problems


# ---------------------------------------------------------------------------------------------- failures


def fail_inserts(conn, target: str, message: str = "injected failure") -> None:
    """Make every INSERT into ``target`` (``"dwd.dim_goods"``) fail: a load of that table fails after its
    earlier statements ran, so only a rollback keeps its rows. (Rows that merely do not cast are quarantined
    and no longer fail a table.)"""
    schema, name = target.split(".")
    fn = sql.Identifier(schema, f"fail_{name}")
    conn.execute(sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN"
                         " RAISE EXCEPTION {}; END $f$").format(fn, sql.Literal(message)))
    conn.execute(sql.SQL("CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
        sql.Identifier(f"fail_{name}"), sql.Identifier(schema, name), fn))


# ---------------------------------------------------------------------------------------------- environment


class DwdEnv:
    """A database with every ODS and DWD table, an autocommit connection, an :class:`Ods` writer and helpers."""

    def __init__(self, dsn: str, *, timezone_name: str = "Asia/Shanghai"):
        import psycopg

        from feiqiu_etl.db.schema import ensure_ods_tables
        from feiqiu_etl.tasks.dwd import ensure_dwd_tables, load_dwd_mapping

        self.dsn = dsn
        self.mapping = load_dwd_mapping()
        self.conn = psycopg.connect(dsn, autocommit=True, options=f"-c TimeZone={timezone_name}")
        ensure_ods_tables(self.conn, load_connector().tasks)
        ensure_dwd_tables(self.conn, self.mapping)
        self.ods = Ods(self.conn)

    def close(self) -> None:
        self.conn.close()

    def table(self, name: str):
        return self.mapping.table(name)

    def merge(self, name: str, now: datetime, run_id: str = "r-test"):
        from feiqiu_etl.tasks.dwd.scd2 import merge_dim_scd2

        return merge_dim_scd2(self.conn, self.table(name), now=now, run_id=run_id)

    def load_fact(self, name: str, run_id: str = "r-test"):
        from feiqiu_etl.tasks.dwd.facts import load_fact

        return load_fact(self.conn, self.table(name), run_id=run_id)

    def rows(self, name: str, columns: str = "*", order: str | None = None) -> list[dict]:
        """All rows of ``dwd.<name>`` as dicts, ordered by key (and ``version_no`` for dimensions)."""
        from psycopg.rows import dict_row

        t = self.table(name)
        keys = ["site_id", *t.business_key] + (["version_no"] if t.is_dimension else [])
        q = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(columns), sql.Identifier("dwd", t.name), sql.SQL(order or ", ".join(keys)))
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(q).fetchall()

    def truncate(self, *tables: str) -> None:
        """Empty the given qualified tables and restart their identity columns.

        DELETE rather than TRUNCATE: on the few rows a test writes it is many times faster.
        """
        for t in tables:
            self.conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(*t.split("."))))
            self.conn.execute(
                "SELECT setval(pg_get_serial_sequence(%(t)s, attname), 1, false) FROM pg_attribute"
                " WHERE attrelid = %(t)s::regclass AND attidentity <> ''", {"t": t})
