/* Cancel a run from the page: a button with data-cancel="RUN_ID" opens the confirmation dialog; "Cancel the
   run" sends POST /api/runs/RUN_ID/cancel with the page's CSRF token (X-CSRF-Token). Our own code, no
   library. Emits "feiqiu:cancel-requested" / "feiqiu:cancel-failed" on document. */
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="csrf-token"]');
  var csrf = meta ? meta.content : "";
  var dialog = document.getElementById("cancel-dialog");
  if (!dialog) return;
  var errorBox = dialog.querySelector(".dialog-error");
  var pending = null;

  function buttons(runId) {
    return Array.prototype.filter.call(document.querySelectorAll("[data-cancel]"), function (b) {
      return b.getAttribute("data-cancel") === runId;
    });
  }

  function ask(runId, message) {
    pending = runId;
    dialog.querySelector('[data-field="dialog-run"]').textContent = runId;
    errorBox.hidden = !message;
    errorBox.textContent = message || "";
    dialog.showModal();
    document.getElementById("cancel-keep").focus();
  }

  function send(runId) {
    buttons(runId).forEach(function (b) { b.disabled = true; b.textContent = _("Cancelling…"); });
    return fetch("/api/runs/" + encodeURIComponent(runId) + "/cancel", {
      method: "POST", credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, "Accept": "application/json" }
    }).then(function (res) {
      return res.json().catch(function () { return {}; }).then(function (body) {
        if (res.status === 202) {
          document.dispatchEvent(new CustomEvent("feiqiu:cancel-requested", { detail: { runId: runId } }));
          return;
        }
        var why = body.error || ("HTTP " + res.status);
        buttons(runId).forEach(function (b) { b.disabled = false; b.textContent = _("Cancel…"); });
        document.dispatchEvent(new CustomEvent("feiqiu:cancel-failed", { detail: { runId: runId, error: why } }));
        if (res.status !== 409) ask(runId, _("The cancel was not accepted: %(why)s", { why: why }));
      });
    }, function (err) {
      buttons(runId).forEach(function (b) { b.disabled = false; b.textContent = _("Cancel…"); });
      ask(runId, _("The server did not answer: %(err)s", { err: err }));
    });
  }

  dialog.addEventListener("close", function () {
    var runId = pending;
    pending = null;
    if (dialog.returnValue === "cancel" && runId) send(runId);
  });

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest ? ev.target.closest("[data-cancel]") : null;
    if (!b || b.disabled) return;
    ev.preventDefault();
    ask(b.getAttribute("data-cancel"));
  });

  // On a run's own page: follow the run until it ends, then show its final page.
  var badge = document.getElementById("run-status");
  document.addEventListener("feiqiu:cancel-requested", function (ev) {
    if (!badge) return;
    var runId = ev.detail.runId;
    badge.textContent = _("CANCELLING");
    (function poll() {
      fetch("/api/runs/" + encodeURIComponent(runId), { credentials: "same-origin" })
        .then(function (r) { return r.json(); })
        .then(function (run) {
          if (run.status && run.status !== "RUNNING") window.location.reload();
          else setTimeout(poll, 300);
        }, function () { setTimeout(poll, 1000); });
    })();
  });

  window.FeiqiuCancel = { ask: ask, send: send };
})();
