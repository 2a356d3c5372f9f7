// Live job progress: polls the job's small JSON endpoint, every second while the tab is visible and every
// 10 s while hidden, and stops once the job reaches a terminal state.
(function () {
  "use strict";
  var section = document.getElementById("job");
  var url = section.dataset.progressUrl;
  var timer = null;

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
      cell(row, run.error || run.message);
      rows.appendChild(row);
    });
    var cancel = document.getElementById("cancel-form");
    if (cancel) { cancel.hidden = job.terminal; }
    document.getElementById("retry-form").hidden = !job.terminal;
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
      .then(function (job) { render(job); schedule(job); })
      .catch(function () { timer = window.setTimeout(poll, 5000); });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer !== null) { window.clearTimeout(timer); poll(); }
  });

  var initial = JSON.parse(document.getElementById("job-initial").textContent);
  render(initial);
  schedule(initial);
})();
