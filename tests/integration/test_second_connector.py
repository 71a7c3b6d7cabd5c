"""A second connector written only in YAML (different paths, envelope names, list keys, page parameters,
window parameters and a detail endpoint) runs against its own small HTTP server — no Python for it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from feiqiu_etl.cli import main
from feiqiu_etl.plan import RunOptions
from flowkit import ods_rows, run_opts

TOKEN = "other-api-token"
SHOP = 42
CATALOG = [{"sku": f"S{i:04d}", "shopId": SHOP, "title": f"item {i}", "price": f"{i}.5"} for i in range(7)]
PARTS = {c["sku"]: [{"sku": c["sku"], "partNo": n, "qty": n * 2} for n in range(1, 1 + i % 3)]
         for i, c in enumerate(CATALOG)}
EVENTS = [{"eventId": 9007199254740993 + i, "shopId": SHOP, "happenedAt": f"2024-05-0{1 + i % 3} 10:00:0{i % 10}",
           "kind": "sale"} for i in range(9)]

CONNECTOR_YAML = """
name: othershop
api:
  site_param: shopId
  envelope: {code_field: status, ok_code: 200, message_field: message, data_field: payload}
  pagination: {page_param: pageNo, limit_param: pageSize, first_page: 1, max_limit: 3, max_pages: 50}
  window: {start_param: from, end_param: to, max_days: 2}
  errors: {retry: [503], rate_limited: [], abort_run: [401], abort_site: [403], not_found: [404]}
tasks:
  - code: OTHER_CATALOG
    endpoint: /v2/catalog/query
    kind: snapshot
    table: ods.other_catalog
    data_path: [payload, result]
    list_key: items
    page_size: 3
    keys: [{field: sku, column: sku, type: text}]
    detail:
      endpoint: /v2/catalog/item
      params: {shopId: shopId, sku: sku}
      id_column: sku
      target_table: ods.other_catalog_part
      data_path: [payload, item]
      list_key: parts
      keys: [{field: sku, column: sku, type: text}, {field: partNo, column: part_no, type: integer}]
      parent: {field: sku, column: sku, type: text}
  - code: OTHER_EVENTS
    endpoint: /v2/events/search
    kind: windowed
    table: ods.other_events
    window_field: happenedAt
    data_path: [payload]
    list_key: rows
    page_size: 2
    keys: [{field: eventId, column: event_id, type: bigint}]
"""


class Handler(BaseHTTPRequestHandler):
    log_message = lambda *a: None  # noqa: E731

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send({"status": 401, "message": "no", "payload": None})
        if self.path == "/v2/catalog/query":
            page, size = body["pageNo"], body["pageSize"]
            items = CATALOG[(page - 1) * size: page * size]
            return self._send({"status": 200, "message": "ok", "payload": {"result": {"items": items, "total": len(CATALOG)}}})
        if self.path == "/v2/catalog/item":
            return self._send({"status": 200, "message": "ok", "payload": {"item": {"parts": PARTS[body["sku"]]}}})
        if self.path == "/v2/events/search":
            rows = [e for e in EVENTS if body["from"] <= e["happenedAt"] < body["to"]]
            page, size = body["pageNo"], body["pageSize"]
            return self._send({"status": 200, "message": "ok",
                               "payload": {"rows": rows[(page - 1) * size: page * size], "total": len(rows)}})
        self.send_response(404)
        self.end_headers()

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_yaml_only_connector_runs_end_to_end(server, pg_dsn, tmp_path):
    path = tmp_path / "othershop.yaml"
    path.write_text(CONNECTOR_YAML, encoding="utf-8")
    listing = CliRunner().invoke(main, ["tasks", "--connector", str(path), "--json"])
    assert listing.exit_code == 0
    assert [t["task"] for t in json.loads(listing.output)["tasks"]] == ["OTHER_CATALOG", "OTHER_EVENTS"]

    opts = RunOptions(api_base=server, token=TOKEN, site_ids=[SHOP], connector_path=str(path),
                      overrides={"pipeline.rate_min": 0, "pipeline.rate_max": 0.001, "pipeline.batch_timeout": 0.1},
                      window_start="2024-05-01 00:00:00", window_end="2024-05-04 00:00:00", load_dwd=False, environ={})
    result = run_opts(opts, pg_dsn)
    assert result.status == "SUCCESS", result.to_dict()
    assert ods_rows(pg_dsn, "ods.other_catalog") == {(SHOP, c["sku"]): c for c in CATALOG}
    assert ods_rows(pg_dsn, "ods.other_events") == {(SHOP, e["eventId"]): e for e in EVENTS}
    parts = {(SHOP, p["sku"], p["partNo"]): p for rows in PARTS.values() for p in rows}
    assert ods_rows(pg_dsn, "ods.other_catalog_part") == parts
    events = {t.task_code: t for t in result.tasks}["OTHER_EVENTS"]
    assert len(events.windows) == 2  # 3 days split into segments of at most max_days = 2
