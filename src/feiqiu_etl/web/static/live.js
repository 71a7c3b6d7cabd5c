/* The Live page: one card per running run, updated from /api/status/stream (server-sent events; polling
   /api/status if the stream cannot be opened). Every value is put into the page with textContent, never as
   HTML, so upstream text cannot inject markup. Our own code, no library. */
(function () {
  "use strict";
  var runsBox = document.getElementById("live-runs");
  var finishedBox = document.getElementById("finished-runs");
  var finishedTitle = document.getElementById("finished-title");
  var noRuns = document.getElementById("no-runs");
  var feedState = document.getElementById("feed-state");
  var cards = {};          // run_id -> card element
  var FINAL = { SUCCESS: 1, PARTIAL: 1, FAILED: 1, CANCELLED: 1, INTERRUPTED: 1, DEADLINE: 1 };
  // what the page shows for the codes in the status payload (the codes stay in data-status)
  var STATUS = { RUNNING: _("RUNNING"), SUCCESS: _("SUCCESS"), PARTIAL: _("PARTIAL"), FAILED: _("FAILED"),
                 CANCELLED: _("CANCELLED"), INTERRUPTED: _("INTERRUPTED"), DEADLINE: _("DEADLINE"),
                 BUSY: _("BUSY"), CANCELLING: _("CANCELLING") };
  var PHASE = { starting: _("starting"), ods: _("ODS"), dwd: _("DWD"), finishing: _("finishing"), finished: _("finished") };
  var LANE_STATE = { "waiting for lane": _("waiting for lane"), running: _("running"), finished: _("finished") };
  var WAIT = { gap: _("gap"), floor: _("floor"), "retry-after": _("retry-after"), banned: _("banned"),
               "timeout-hold": _("timeout-hold"), lane: _("lane"), paused: _("paused") };
  function label(map, code) { return code === null || code === undefined ? "" : (map[code] || String(code)); }

  function h(tag, attrs) {
    var el = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") el.textContent = attrs[k];
      else if (k === "cls") el.className = attrs[k];
      else el.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return el;
  }

  function setText(root, field, value) {
    var el = root.querySelector('[data-field="' + field + '"]');
    var text = value === null || value === undefined ? "-" : String(value);
    if (el && el.textContent !== text) el.textContent = text;
    return el;
  }

  function setStatus(card, code) {
    var el = setText(card, "status", label(STATUS, code));
    if (el) el.setAttribute("data-status", code);
    return el;
  }

  function num(v) {
    if (v === null || v === undefined) return "-";
    return Number(v).toLocaleString("en-US", { maximumFractionDigits: 1 });
  }

  function dur(s) {
    if (s === null || s === undefined) return "-";
    s = Math.max(0, Number(s));
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 60) return Math.round(s) + " s";
    var m = Math.floor(s / 60), sec = Math.floor(s % 60);
    if (m < 60) return m + "m" + (sec < 10 ? "0" : "") + sec + "s";
    var hh = Math.floor(m / 60), mm = m % 60;
    return hh + "h" + (mm < 10 ? "0" : "") + mm + "m";
  }

  function clock(iso) {
    // the server's ISO time is in the warehouse's zone (Asia/Shanghai): show its HH:MM:SS as it is
    var m = /T(\d\d:\d\d:\d\d)/.exec(iso || "");
    return m ? m[1] : "";
  }

  function statusClass(s) {
    return ({ RUNNING: "running", SUCCESS: "success", PARTIAL: "partial", FAILED: "failed",
              CANCELLED: "cancelled", INTERRUPTED: "interrupted", DEADLINE: "deadline" })[s] || "unknown";
  }

  function stat(label, field) {
    return h("div", { cls: "stat" }, h("div", { cls: "k", text: label }), h("div", { cls: "v", "data-field": field, text: "-" }));
  }

  function newCard(run) {
    var id = run.run_id;
    var card = h("article", { cls: "run-card", id: "run-" + id, "data-run-id": id },
      h("header", {},
        h("a", { cls: "mono run-link", href: "/runs/" + encodeURIComponent(id), text: id }),
        h("span", { cls: "badge running", "data-field": "status", "data-status": run.status, text: label(STATUS, run.status) }),
        h("span", { cls: "phase", "data-field": "phase", text: "" }),
        h("span", { cls: "muted small beat", "data-field": "beat", text: "" }),
        h("span", { cls: "spacer" }),
        h("button", { type: "button", cls: "danger", "data-cancel": id, text: _("Cancel…") })),
      h("progress", { max: "1", value: "0", "data-field": "progress" }),
      h("div", { cls: "stats" },
        stat(_("tasks"), "tasks"), stat(_("rows written"), "rows_written"), stat(_("rows/s"), "rows_per_s"),
        stat(_("requests sent"), "requests_sent"), stat(_("requests left"), "requests_remaining"),
        stat(_("ETA"), "eta"), stat(_("elapsed"), "elapsed")),
      h("p", { cls: "note", "data-field": "note", hidden: "" }),
      h("table", { cls: "grid lanes" },
        h("thead", {}, h("tr", {},
          h("th", { text: _("Lane") }), h("th", { text: _("State") }), h("th", { text: _("Current request") }),
          h("th", { text: _("Next request") }), h("th", { cls: "num", text: _("Queues f/p/w") }),
          h("th", { cls: "num", text: _("Rows/s") }), h("th", { cls: "num", text: _("Requests done / left") }),
          h("th", { cls: "num", text: _("Throttled / banned") }), h("th", { cls: "num", text: _("ETA") }))),
        h("tbody", { "data-field": "lanes" })));
    cards[id] = card;
    return card;
  }

  function nextText(lane) {
    var cur = lane.current || {};
    if (lane.tripped) return _("stopped: %(why)s", { why: lane.tripped });
    if (lane.state === "finished") return "-";
    if (lane.wait_reason === "banned") return _("banned by upstream: %(t)s left", { t: dur(lane.next_due_in) });
    if (lane.wait_reason) return _("in %(t)s (%(why)s)", { t: dur(lane.next_due_in), why: label(WAIT, lane.wait_reason) });
    if (cur.in_flight) return _("in flight");
    return _("now");
  }

  function laneRow(lane) {
    var cur = lane.current || {};
    var q = lane.queues || {};
    var current = cur.task ? (cur.task + " · " + String(cur.site_id || "").slice(-4) + (cur.request ? " · " + cur.request : "")) : "-";
    var bad = lane.tripped || lane.wait_reason === "banned" || lane.stalled_for != null;
    return h("tr", { "data-lane": lane.name },
      h("td", {}, h("strong", { text: lane.name })),
      h("td", { text: label(LANE_STATE, lane.state) + (lane.stalled_for != null ? " · " + _("stalled %(s)s s", { s: Math.round(lane.stalled_for) }) : "")
        + " · " + lane.tasks_done + "/" + lane.tasks }),
      h("td", { cls: "mono small", "data-field": "current", text: current }),
      h("td", { cls: bad ? "bad" : "", "data-field": "next", text: nextText(lane) }),
      h("td", { cls: "num", text: (q.frontier || 0) + " / " + (q.processing || 0) + " / " + (q.write || 0) }),
      h("td", { cls: "num", text: num(lane.rows_per_s) }),
      h("td", { cls: "num", text: num(lane.requests_sent) + " / ~" + num(lane.requests_remaining) }),
      h("td", { cls: "num" + (lane.throttled || lane.banned ? " warn" : ""), text: num(lane.throttled) + " / " + num(lane.banned) }),
      h("td", { cls: "num", text: dur(lane.eta_s) }));
  }

  function updateRunning(card, run, serverNow) {
    var live = run.live || {};
    setText(card, "phase", label(PHASE, live.phase || "starting"));
    var beat = run.heartbeat_at ? (serverNow - Date.parse(run.heartbeat_at)) / 1000 : null;
    setText(card, "beat", beat === null ? "" : _("updated %(t)s ago", { t: dur(Math.max(0, beat)) }));
    setText(card, "tasks", (live.tasks_done || 0) + " / " + (live.tasks || 0));
    setText(card, "rows_written", num(live.rows_written));
    setText(card, "rows_per_s", num(live.rows_per_s));
    setText(card, "requests_sent", num(live.requests_sent));
    setText(card, "requests_remaining", "~" + num(live.requests_remaining));
    setText(card, "eta", dur(live.eta_s));
    setText(card, "elapsed", dur(live.elapsed_s !== undefined ? live.elapsed_s : run.duration));
    var p = card.querySelector('[data-field="progress"]');
    var total = (live.requests_sent || 0) + (live.requests_remaining || 0);
    p.value = total ? (live.requests_sent || 0) / total : 0;
    var note = card.querySelector('[data-field="note"]');
    if (run.cancel_requested_at || live.cancelling) {
      note.hidden = false;
      setText(card, "note", run.cancel_requested_by
        ? _("Cancel requested by %(who)s: finishing what is in flight…", { who: run.cancel_requested_by })
        : _("Cancel requested: finishing what is in flight…"));
      setStatus(card, "CANCELLING");
    }
    var body = card.querySelector('[data-field="lanes"]');
    var rows = (live.lanes || []).map(laneRow);
    var key = JSON.stringify(live.lanes || []);
    if (body.getAttribute("data-key") !== key) {
      body.setAttribute("data-key", key);
      while (body.firstChild) body.removeChild(body.firstChild);
      rows.forEach(function (r) { body.appendChild(r); });
    }
  }

  function finish(card, run) {
    var badge = setStatus(card, run.status);
    badge.className = "badge " + statusClass(run.status);
    card.setAttribute("data-status", run.status);
    card.classList.add("done");
    var btn = card.querySelector("[data-cancel]");
    if (btn) btn.remove();
    setText(card, "beat", _("ended %(t)s", { t: clock(run.finished_at) }));
    if (run.tasks) setText(card, "tasks", String(run.tasks.length));
    setText(card, "phase", label(PHASE, "finished"));
    if (run.rows_written !== undefined) setText(card, "rows_written", num(run.rows_written));
    if (run.requests !== undefined) setText(card, "requests_sent", num(run.requests));
    setText(card, "requests_remaining", "-");
    setText(card, "eta", "-");
    setText(card, "rows_per_s", "-");
    setText(card, "elapsed", dur(run.duration));
    var note = card.querySelector('[data-field="note"]');
    if (run.error) { note.hidden = false; setText(card, "note", run.error); }
    else note.hidden = true;
    var p = card.querySelector('[data-field="progress"]');
    if (p) p.remove();
    var lanes = card.querySelector("table.lanes");
    if (lanes) lanes.remove();
    if (card.parentNode !== finishedBox) finishedBox.insertBefore(card, finishedBox.firstChild);
  }

  function render(data) {
    if (data.error) { state("error", data.error); return; }
    var serverNow = Date.parse(data.now) || Date.now();
    var running = data.running || [];
    var finished = data.finished || [];
    var seen = {};
    running.forEach(function (run) {
      seen[run.run_id] = true;
      var card = cards[run.run_id] || newCard(run);
      if (card.parentNode !== runsBox) runsBox.appendChild(card);
      card.setAttribute("data-status", "RUNNING");
      if (run.heartbeat_at) card.setAttribute("data-heartbeat", run.heartbeat_at);
      updateRunning(card, run, serverNow);
    });
    finished.forEach(function (run) {
      if (seen[run.run_id]) return;
      var card = cards[run.run_id] || newCard(run);
      finish(card, run);
    });
    noRuns.hidden = running.length > 0;
    finishedTitle.hidden = !finishedBox.firstChild;
    state("live", _("live · %(t)s", { t: clock(data.now) }));
    document.dispatchEvent(new CustomEvent("feiqiu:live-rendered", { detail: { at: Date.now() } }));
  }

  function state(name, text) {
    feedState.setAttribute("data-state", name);
    feedState.textContent = text;
  }

  function poll() {
    fetch("/api/status", { credentials: "same-origin" }).then(function (r) {
      if (r.status === 401) { window.location.href = "/login?next=/live"; return null; }
      return r.json();
    }).then(function (d) { if (d) render(d); }, function () { state("error", _("server unreachable, retrying…")); })
      .then(function () { setTimeout(poll, 1000); });
  }

  try {
    var initial = JSON.parse(document.getElementById("initial-status").textContent);
    render(initial);
  } catch (e) { /* the stream brings the first state */ }

  if (window.EventSource) {
    var es = new EventSource("/api/status/stream");
    es.onmessage = function (ev) { render(JSON.parse(ev.data)); };
    es.onerror = function () {
      if (es.readyState === EventSource.CLOSED) { state("error", _("stream closed; polling")); poll(); }
      else state("reconnecting", _("reconnecting…"));
    };
  } else {
    poll();
  }

  document.addEventListener("feiqiu:cancel-requested", function (ev) {
    var card = cards[ev.detail.runId];
    if (card) { setStatus(card, "CANCELLING"); }
  });
})();
