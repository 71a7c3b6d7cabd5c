"""Stateful property test of the SCD2 merge (warehouse-model §4.2, §4.3) on real PostgreSQL.

A hypothesis ``RuleBasedStateMachine`` drives random sequences of ODS changes to ``ods.goods`` (inserts, tracked
and type-1 updates, NULL↔value, soft deletes, rows vanishing, revivals, several ODS rows for one business key,
rows whose sale price does not cast) and merges into ``dwd.dim_goods`` with increasing ``now`` values. A row that
does not cast and wins its key is quarantined and leaves that key as it was (warehouse-model §3.1). A small Python model of §4.2 predicts every
version; after every step the table must equal the model and every §4.3 rule is checked. One database is
reused; each example starts from TRUNCATE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from dwd_support import CST, OPEN_END, DwdEnv, at, payload, scd2_violations
from feiqiu_etl.tasks.dwd.scd2 import MergeTimeError, merge_dim_scd2

TRACKED = ("goods_name", "category_id", "barcode", "unit", "sale_price", "member_price", "cost_price", "is_on_sale")
TYPE1 = ("stock_qty", "specs", "create_time")
GOODS = st.integers(1, 3)

tracked_fields = st.fixed_dictionaries({
    "goodsName": st.sampled_from(["红牛🐂 250ml", "可乐", "", "null"]),
    "categoryId": st.sampled_from([1, 2]),
    "barcode": st.sampled_from(["", "6920202888883"]),
    "salePrice": st.sampled_from(["8", "8.0", "8.00", "12.5", "12.50", ""]),
    "memberPrice": st.sampled_from(["", "7.5"]),
    "costPrice": st.sampled_from([2.3, 3, 0]),
    "isOnSale": st.sampled_from([0, 1]),
})
type1_fields = st.fixed_dictionaries({
    "stockQty": st.sampled_from([0, 5, 48]),
    "specs": st.sampled_from([[], [{"specName": "大瓶", "price": "12"}]]),
    "createTime": st.sampled_from(["2023-05-01 10:00:00", "2024-01-01 00:00:00", ""]),
})
fetch_times = st.integers(0, 4)  # few values, so ties on fetched_at happen and the ODS key decides
POISON = ("十二块", "1e40", "8.8.8")  # sale prices that do not cast to numeric(12,2)


def _money(text) -> Decimal | None:
    return None if text == "" else Decimal(str(text)).quantize(Decimal("0.01"))


def cast(fields: dict) -> dict:
    """The model's reading of a goods payload: warehouse-model §3, in Python."""
    ts = fields["createTime"]
    return {
        "goods_name": fields["goodsName"] or None, "category_id": fields["categoryId"],
        "barcode": fields["barcode"] or None, "unit": fields["unit"] or None,
        "sale_price": _money(fields["salePrice"]), "member_price": _money(fields["memberPrice"]),
        "cost_price": _money(fields["costPrice"]), "is_on_sale": fields["isOnSale"] == 1,
        "stock_qty": fields["stockQty"], "specs": fields["specs"],
        "create_time": datetime.fromisoformat(ts).replace(tzinfo=CST) if ts else None,
    }


@dataclass
class OdsRow:
    bk: int
    fields: dict
    fetched: int
    deleted: bool = False

    @property
    def bad(self) -> bool:
        return self.fields["salePrice"] in POISON


@dataclass
class Version:
    values: dict
    version_no: int
    valid_from: datetime
    valid_to: datetime = OPEN_END
    closed_by_delete: bool = False

    def row(self, bk: int) -> tuple:
        return (str(100230 + bk), self.version_no, self.valid_from, self.valid_to, self.valid_to == OPEN_END,
                *(self.values[c] for c in TRACKED + TYPE1))


@dataclass
class Model:
    ods: dict[str, OdsRow] = field(default_factory=dict)  # ODS goods_id -> row
    dwd: dict[int, list[Version]] = field(default_factory=dict)  # BK -> versions in order

    held: set[str] = field(default_factory=set)  # ODS keys in quarantine after the last merge

    def winners(self) -> dict[int, tuple[str, OdsRow]]:
        """One ODS row per BK: live first, then latest fetched_at, then greatest ODS key (all keys 6 digits)."""
        best: dict[int, tuple] = {}
        for key, r in self.ods.items():
            rank = (not r.deleted, r.fetched, key)
            if r.bk not in best or rank > best[r.bk][0]:
                best[r.bk] = (rank, key, r)
        return {bk: v[1:] for bk, v in best.items()}

    def merge(self, now: datetime) -> tuple[int, int, int]:
        inserted = updated = closed = 0
        winners = self.winners()
        self.held = {key for key, r in winners.values() if r.bad}
        source = {bk: r for bk, (_, r) in winners.items()}
        for bk in sorted(set(source) | set(self.dwd)):
            versions = self.dwd.setdefault(bk, [])
            cur = versions[-1] if versions and versions[-1].valid_to == OPEN_END else None
            src = source.get(bk)
            if src is not None and src.bad:  # quarantined: the key stays as it was
                continue
            if src is None or src.deleted:
                if cur:
                    cur.valid_to, cur.closed_by_delete = now, True
                    closed += 1
                continue
            values = cast(src.fields)
            if cur and all(cur.values[c] == values[c] for c in TRACKED):
                if any(cur.values[c] != values[c] for c in TYPE1):
                    cur.values.update({c: values[c] for c in TYPE1})
                    updated += 1
                continue
            if cur:
                cur.valid_to = now
                closed += 1
            versions.append(Version(values, len(versions) + 1, now))
            inserted += 1
        return inserted, updated, closed

    def rows(self) -> list[tuple]:
        return [v.row(bk) for bk in sorted(self.dwd) for v in self.dwd[bk]]


class Scd2Machine(RuleBasedStateMachine):
    env: DwdEnv  # set by the test

    def __init__(self):
        super().__init__()
        self.model = Model()
        self.merges = 0
        self.dirty = False
        self.closed_rows: dict[int, tuple] = {}
        self.table = self.env.table("dim_goods")
        self.env.truncate("ods.goods", "dwd.dim_goods", "etl_meta.dwd_quarantine")

    def now(self, n: int) -> datetime:
        return at(1000 + 10 * n)

    def _put(self, ods_key: str, bk: int, fields: dict, fetched: int, deleted: bool = False) -> None:
        record = payload("ods.goods", bk, **fields)
        self.env.ods.put("ods.goods", record, fetched_at=at(fetched), key=(ods_key,), is_deleted=deleted,
                         deleted_at=at(fetched) if deleted else None)
        self.model.ods[ods_key] = OdsRow(bk, {**record}, fetched, deleted)
        self.dirty = True

    # ------------------------------------------------------------------------------------------- rules

    @initialize(n=GOODS, tracked=tracked_fields, type1=type1_fields, fetched=fetch_times)
    def first_row(self, n, tracked, type1, fetched):
        self._put(str(100230 + n), n, {**tracked, **type1}, fetched)

    @rule(n=GOODS, tracked=tracked_fields, type1=type1_fields, fetched=fetch_times)
    def upsert(self, n, tracked, type1, fetched):
        """Insert, change tracked and/or type-1 columns, or revive (writing a live row)."""
        self._put(str(100230 + n), n, {**tracked, **type1}, fetched)

    @precondition(lambda self: any(not r.deleted for r in self.model.ods.values()))
    @rule(data=st.data(), type1=type1_fields)
    def change_type1_only(self, data, type1):
        key = data.draw(st.sampled_from(sorted(k for k, r in self.model.ods.items() if not r.deleted)))
        row = self.model.ods[key]
        self._put(key, row.bk, {**row.fields, **type1}, row.fetched)

    @rule(n=GOODS, j=st.integers(1, 2), tracked=tracked_fields, type1=type1_fields, fetched=fetch_times,
          deleted=st.booleans())
    def duplicate_key(self, n, j, tracked, type1, fetched, deleted):
        """Another ODS row (key 9002nj) whose payload names the same goodsId as goods n."""
        self._put(str(900000 + 10 * n + j), n, {**tracked, **type1}, fetched, deleted)

    @rule(n=GOODS, price=st.sampled_from(POISON), type1=type1_fields, fetched=fetch_times, duplicate=st.booleans(),
          deleted=st.booleans())
    def poison(self, n, price, type1, fetched, duplicate, deleted):
        """A row of goods n (its own ODS key, or the duplicate 9002n1) whose sale price does not cast."""
        key = str(900000 + 10 * n + 1) if duplicate else str(100230 + n)
        self._put(key, n, {"salePrice": price, **type1}, fetched, deleted)

    @precondition(lambda self: self.model.ods)
    @rule(data=st.data())
    def soft_delete(self, data):
        key = data.draw(st.sampled_from(sorted(self.model.ods)))
        row = self.model.ods[key]
        self.env.ods.soft_delete("ods.goods", payload("ods.goods", row.bk), at_=at(5), key=(key,))
        row.deleted = True
        self.dirty = True

    @precondition(lambda self: self.model.ods)
    @rule(data=st.data())
    def vanish(self, data):
        """The ODS row disappears entirely: its key is absent from S."""
        key = data.draw(st.sampled_from(sorted(self.model.ods)))
        self.env.conn.execute("DELETE FROM ods.goods WHERE goods_id = %s", (key,))
        del self.model.ods[key]
        self.dirty = True

    @rule(twice=st.booleans())
    def merge(self, twice):
        for _ in range(2 if twice else 1):
            self.merges += 1
            now = self.now(self.merges)
            got = merge_dim_scd2(self.env.conn, self.table, now=now, run_id=f"r{self.merges}")
            expected = self.model.merge(now)
            assert (got.inserted, got.updated, got.closed) == expected
            if not self.dirty:  # §4.3 rule 3: nothing changed in ODS, nothing is written
                assert expected == (0, 0, 0)
            self.dirty = False

    @precondition(lambda self: any(self.model.dwd.values()))
    @rule(earlier=st.sampled_from([0, 1, 10]))
    def merge_with_stale_now(self, earlier):
        latest = max(v.valid_from for versions in self.model.dwd.values() for v in versions)
        with pytest.raises(MergeTimeError):
            merge_dim_scd2(self.env.conn, self.table, now=latest - timedelta(seconds=earlier), run_id="stale")

    # -------------------------------------------------------------------------------------- invariants

    @invariant()
    def table_equals_model_and_rules_hold(self):
        conn = self.env.conn
        assert scd2_violations(conn, "dim_goods", ["goods_id"]) == []  # §4.3 rules 1, 2
        rows = conn.execute(
            "SELECT goods_id, version_no, valid_from, valid_to, is_current, " + ", ".join(TRACKED + TYPE1)
            + " FROM dwd.dim_goods ORDER BY goods_id, version_no").fetchall()
        assert rows == self.model.rows()  # §4.2 and rules 3–6 (one version per change, NULL is a value, …)
        held = {r[0] for r in conn.execute("SELECT source_key->>'goods_id' FROM etl_meta.dwd_quarantine"
                                            " WHERE table_name = 'dwd.dim_goods' AND column_name = 'sale_price'")}
        assert held == self.model.held  # §3.1: exactly the winners that do not cast
        bad_hash = conn.execute(
            "SELECT count(*) FROM dwd.dim_goods WHERE change_hash <> md5(jsonb_build_array("
            + ", ".join(TRACKED) + ")::text)").fetchone()[0]
        assert bad_hash == 0
        for versions in self.model.dwd.values():  # rule 2: a gap only where a deletion closed the version
            for prev, nxt in zip(versions, versions[1:]):
                assert (prev.valid_to == nxt.valid_from) != prev.closed_by_delete
        closed = {r[0]: r[1:] for r in conn.execute(
            "SELECT dim_goods_sk, dwd.dim_goods.* FROM dwd.dim_goods WHERE NOT is_current")}
        for sk, row in self.closed_rows.items():  # rule 7: closed rows never change
            assert closed[sk] == row
        self.closed_rows = closed


def test_scd2_merge_state_machine(pg_dsn):
    env = DwdEnv(pg_dsn)
    try:
        machine = type("BoundScd2Machine", (Scd2Machine,), {"env": env})
        run_state_machine_as_test(machine, settings=settings(settings.default, stateful_step_count=12))
    finally:
        env.close()
