"""Property 10 (spec §5): Detail_Mode is optional and, when on, follows the list and the same gap rules.

The specs are the connector's own Detail_Mode tasks (``feiqiu.yaml``: member, settlement, group package),
run once as they are and once with ``detail`` removed, over the same list pages. ``process_fn`` is the
real :class:`OdsProcessor`; ``write_fn`` is an in-memory stand-in for ``OdsWriter`` that follows its
detail rules with the real ``detail_request()`` (a new or changed parent gets one detail request, an
unchanged one counts as ``follow_ups_skipped``).

Without Detail_Mode: no detail request, all detail counters 0. With it: the list part is unchanged,
every new/changed parent is fetched exactly once with the spec's endpoint and parameters, after its
parent row was written, and every gap — list or detail — lies in ``[rate_min, rate_max]``.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from functools import lru_cache

from hypothesis import given
from hypothesis import strategies as st

from feiqiu_etl.connector.model import load_connector
from feiqiu_etl.pipeline import FakeClock, PipelineRequest, WriteResult
from feiqiu_etl.tasks.ods.processing import OdsProcessor
from feiqiu_etl.tasks.ods.rows import DetailDone, OdsRow, layouts_for
from feiqiu_etl.connector.spec import KeyColumn, OdsTaskSpec
from feiqiu_etl.tasks.ods.writer import detail_request

from pipeline_support import UpstreamError, gaps, pipeline_configs, run_engine

SITE = 7
DETAIL_TASKS = ("ODS_MEMBER", "ODS_SETTLEMENT", "ODS_GROUP_PACKAGE")
EPS = 1e-9


@lru_cache(maxsize=None)
def connector_spec(code: str) -> OdsTaskSpec:
    return load_connector().task(code)


def typed(key: KeyColumn, n: int):
    return str(n).zfill(3) if key.sql_type == "text" else n


def list_record(spec: OdsTaskSpec, n: int, content: int) -> dict:
    record = {k.field: typed(k, n) for k in spec.keys}
    if spec.window_field:
        record[spec.window_field] = f"2026-03-0{1 + n % 5} 1{content}:00:00"
    return record | {"siteId": SITE, "note": f"v{content}"}


class FakeOdsApi:
    """Pages of one list (``page``/``limit`` paging, data at the spec's path) and detail responses."""

    def __init__(self, spec: OdsTaskSpec, records: list[dict], page_size: int, failing: set, clock: FakeClock):
        self.spec, self.records, self.page_size, self.failing, self.clock = spec, records, page_size, failing, clock
        self.detail_spec = connector_spec(spec.code).detail  # the shape of the detail answer
        self.lock = threading.Lock()
        self.sent: list[tuple[PipelineRequest, float, float]] = []

    def seeds(self) -> list[PipelineRequest]:
        return [PipelineRequest(self.spec.endpoint, {"siteId": SITE, "page": 1, "limit": self.page_size},
                                page_size=self.page_size, data_path=self.spec.data_path,
                                list_key=self.spec.list_key, scope=("list", self.spec.code))]

    @staticmethod
    def envelope(path: tuple[str, ...], list_key: str, items: list, total: int) -> dict:
        node: dict = {list_key: items, "total": total}
        for key in reversed(path):
            node = {key: node}
        return node

    def transport(self, req: PipelineRequest, send):
        def call():
            start = self.clock.monotonic()
            self.clock.advance(0.3)
            with self.lock:
                self.sent.append((req, start, self.clock.monotonic()))
            if req.is_detail:
                if req.detail_id in self.failing:
                    raise UpstreamError(f"detail {req.detail_id}: code 50001")
                d = self.detail_spec
                parent = req.context["record"][d.id_column]
                items = [{**{k.field: typed(k, j) for k in d.keys}, d.parent.field: parent} for j in range(2)]
                return self.envelope(d.data_path, d.list_key, items, len(items))
            page = req.params["page"]
            chunk = self.records[(page - 1) * self.page_size: page * self.page_size]
            return self.envelope(self.spec.data_path, self.spec.list_key, chunk, len(self.records))
        return send(call)


class MemoryOdsWriter:
    """``write_fn`` keeping tables in memory, with ``OdsWriter``'s detail-request rules."""

    def __init__(self, spec: OdsTaskSpec, initial: dict):
        self.spec = spec
        self.tables: dict[str, dict] = {spec.table: dict(initial)}
        self.requested: set = set()
        self.log: list[tuple[str, object, str]] = []  # ("row", parent id, outcome) / ("detail", id, "")

    def write(self, rows: list) -> WriteResult:
        result = WriteResult()
        for row in rows:
            if isinstance(row, DetailDone):
                continue
            assert isinstance(row, OdsRow)
            table = self.tables.setdefault(row.table, {})
            old = table.get((row.site_id, row.keys))
            table[(row.site_id, row.keys)] = row.content_hash
            outcome = "inserted" if old is None else "skipped" if old == row.content_hash else "updated"
            setattr(result, outcome, getattr(result, outcome) + 1)
            if row.table != self.spec.table:
                continue
            self.log.append(("row", row.record[row_id_field(self.spec)], outcome))
            if self.spec.detail is None:
                continue
            if outcome == "skipped":
                result.follow_ups_skipped += 1
                continue
            request = detail_request(self.spec, row.record, scope=row.scope)
            if (row.site_id, request.context["parent_key"]) not in self.requested:
                self.requested.add((row.site_id, request.context["parent_key"]))
                result.follow_ups.append(request)
                self.log.append(("detail", request.detail_id, ""))
        return result


def row_id_field(spec: OdsTaskSpec) -> str:
    return spec.detail.id_column if spec.detail else connector_spec(spec.code).detail.id_column


def run_task(spec, records, page_size, failing, initial, config, engine="unified"):
    api = FakeOdsApi(spec, records, page_size, failing, FakeClock())
    writer = MemoryOdsWriter(spec, initial)
    processor = OdsProcessor(spec, SITE, layouts_for(spec), max_pages=1000)
    api.process, api.write = processor, writer.write
    result = run_engine(engine, api, config, requests=api.seeds())
    return api, writer, result


# Feature: etl-unified-pipeline, Property 10: Detail_Mode 可选性
@given(
    code=st.sampled_from(DETAIL_TASKS),
    ids=st.lists(st.integers(1, 40), max_size=9),
    page_size=st.integers(1, 4),
    unchanged=st.sets(st.integers(1, 40), max_size=5),
    failing=st.sets(st.integers(1, 40), max_size=3),
    config=pipeline_configs(),
)
def test_p10_detail_mode_is_optional_and_follows_the_list_under_the_same_gaps(
    code, ids, page_size, unchanged, failing, config
):
    with_detail = connector_spec(code)
    list_only = replace(with_detail, detail=None)
    records = [list_record(with_detail, n, content=i % 2) for i, n in enumerate(ids)]
    layout = layouts_for(with_detail)[with_detail.table]
    probe = OdsProcessor(with_detail, SITE, {with_detail.table: layout}, 1000)
    # rows already stored with the same content: their parents need no detail (follow_ups_skipped)
    initial = {}
    for rec in records:
        row = probe._row(rec, layout, None, None, window_field=with_detail.window_field)  # noqa: SLF001
        if rec[with_detail.detail.id_column] in {typed(with_detail.keys[0], n) for n in unchanged}:
            initial[(row.site_id, row.keys)] = row.content_hash
    failing_ids = {typed(with_detail.keys[0], n) for n in failing}

    plain_api, plain_writer, plain = run_task(list_only, records, page_size, failing_ids, initial, config)
    api, writer, result = run_task(with_detail, records, page_size, failing_ids, initial, config)

    # without Detail_Mode: no detail stage at all
    assert not any(req.is_detail for req, _, _ in plain_api.sent)
    assert (plain.detail_success, plain.detail_failure, plain.detail_skipped) == (0, 0, 0)
    # with it, the list part is exactly the pure list run
    assert [r.params for r, _, _ in api.sent if not r.is_detail] == [r.params for r, _, _ in plain_api.sent]
    assert writer.tables[with_detail.table] == plain_writer.tables[with_detail.table]
    assert [e for e in writer.log if e[0] == "row"] == plain_writer.log
    # exactly one detail per new or changed parent, with the spec's endpoint and parameters
    details = [(i, req) for i, (req, _, _) in enumerate(api.sent) if req.is_detail]
    changed = {p for _, p, outcome in plain_writer.log if outcome in ("inserted", "updated")}
    assert Counter(req.detail_id for _, req in details) == Counter({p: 1 for p in changed})
    for i, req in details:
        assert req.endpoint == with_detail.detail.endpoint
        assert req.params == with_detail.detail.param_builder(req.context["record"])
        # sent after the list page that first holds its parent (the list is fetched first)
        first = next(n for n, rec in enumerate(records) if rec[with_detail.detail.id_column] == req.detail_id)
        assert any(r.params["page"] == first // page_size + 1 for r, _, _ in api.sent[:i] if not r.is_detail)
    # the detail counters add up: fetched, failed, or not needed (parent unchanged)
    assert result.detail_success + result.detail_failure == len(details)
    assert result.detail_failure == sum(req.detail_id in failing_ids for _, req in details)
    assert result.detail_skipped == sum(outcome == "skipped" for _, _, outcome in plain_writer.log)
    # the same lane rules for every request, list or detail
    for _, _, gap in gaps([(repr(r.params), start, end) for r, start, end in api.sent]):
        assert config.rate_min - EPS <= gap <= config.rate_max + EPS
