// Live job progress: polls the job's small JSON endpoint, every second while the tab is visible and every
// 10 s while hidden, and stops once the job reaches a terminal state. After FAILURES_SHOWN failed polls in a row
// it says the connection is lost (since when), so a page never shows a stale "Running" as if it were live.
(function () {
  "use strict";
  var FAILURES_SHOWN = 3;
  var section = document.getElementById("job");
  var url = section.dataset.progressUrl;
  var timer = null;
  var failures = 0;
  var lastAnswer = new Date();

  function clock(iso) {
    return iso ? new Date(iso).toLocaleTimeString() : "—";
  }

  function elapsed(seconds) {
    if (seconds === null || seconds === undefined) { return "—"; }
    // Rounded once, before it is split: 599.6 s is "10 min 0 s", never "9 min 60 s" (nor 59.96 s "60.0 s").
    if (seconds < 59.95) { return seconds.toFixed(1) + " s"; }
    var whole = Math.round(seconds);
    var minutes = Math.floor(whole / 60);
    return minutes + " min " + (whole - 60 * minutes) + " s";
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function render(job) {
    var status = document.getElementById("job-status");
    status.textContent = job.status_label;
    status.className = "status status-" + job.status;
    document.getElementById("job-progress").value = job.progress;
    document.getElementById("job-percent").textContent = Math.round(job.progress * 100) + "%";
    var error = document.getElementById("job-error");
    error.textContent = job.error;
    error.hidden = !job.error;
    document.getElementById("job-log").textContent = job.log;
    // The headline and the outcome lines follow the job while it runs: the running stage, and each ended stage's
    // outcome as soon as it ends (the page never leads with a stage that finished long ago).
    var headline = document.getElementById("job-headline");
    headline.textContent = job.headline;
    headline.hidden = !job.headline;
    var rows = document.getElementById("stage-rows");
    rows.replaceChildren();
    job.stage_runs.forEach(function (run) {
      var row = document.createElement("tr");
      var kind = cell(row, run.page ? "" : run.kind);
      if (run.page) {
        var link = document.createElement("a");
        link.href = run.page;
        link.textContent = run.kind;
        kind.appendChild(link);
      }
      cell(row, run.node);
      var badge = document.createElement("span");
      badge.className = "status status-" + run.status;
      badge.textContent = run.status;
      cell(row, "").appendChild(badge);
      var bar = document.createElement("progress");
      bar.max = 1;
      bar.value = run.progress;
      cell(row, "").appendChild(bar);
      cell(row, clock(run.started));
      cell(row, clock(run.finished));
      cell(row, elapsed(run.elapsed_s));
      cell(row, run.error || run.message);
      rows.appendChild(row);
    });
    (job.pending_stages || []).forEach(function (kind) {
      var row = document.createElement("tr");
      row.className = "pending";
      cell(row, kind);
      cell(row, "—");
      var badge = document.createElement("span");
      badge.className = "status status-pending";
      badge.textContent = "pending";
      cell(row, "").appendChild(badge);
      ["", "—", "—", "—", "waits for the stages before it"].forEach(function (text) { cell(row, text); });
      rows.appendChild(row);
    });
    renderOutcomes(job.outcomes || []);
    var cancel = document.getElementById("cancel-form");
    if (cancel) { cancel.hidden = job.terminal; }
    document.getElementById("retry-form").hidden = !job.terminal;
  }

  function renderOutcomes(outcomes) {
    var list = document.getElementById("job-outcomes");
    if (!list) {
      list = document.createElement("ul");
      list.id = "job-outcomes";
      list.className = "outcomes";
      document.getElementById("job-error").after(list);
    }
    list.replaceChildren();
    list.hidden = outcomes.length === 0;
    outcomes.forEach(function (item) {
      var entry = document.createElement("li");
      var badge = document.createElement("span");
      badge.className = "status status-" + item.status;
      badge.textContent = item.status;
      var kind = document.createElement("strong");
      kind.textContent = item.kind;
      entry.append(badge, " ", kind, " on " + item.node + ": " + item.summary);
      item.warnings.forEach(function (warning) {
        var note = document.createElement("small");
        note.className = "flag";
        note.textContent = "⚠ " + warning;
        entry.append(document.createElement("br"), note);
      });
      list.appendChild(entry);
    });
  }

  function schedule(job) {
    if (job.terminal) { return; }
    timer = window.setTimeout(poll, document.hidden ? 10000 : 1000);
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (job) { connected(); render(job); schedule(job); })
      .catch(function () { lost(); timer = window.setTimeout(poll, 5000); });
  }

  function connected() {
    failures = 0;
    lastAnswer = new Date();
    document.getElementById("job-connection").hidden = true;
  }

  function lost() {
    failures += 1;
    if (failures < FAILURES_SHOWN) { return; }
    var banner = document.getElementById("job-connection");
    banner.textContent = "Connection lost: the server has not answered since " + lastAnswer.toLocaleTimeString() +
      " (" + failures + " tries); what this page shows may be out of date. Retrying every 5 s.";
    banner.hidden = false;
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer !== null) { window.clearTimeout(timer); poll(); }
  });

  var initial = JSON.parse(document.getElementById("job-initial").textContent);
  render(initial);
  schedule(initial);
})();
