// Sharded runs of one model: the slowest rank's decode time per step for each run, oldest to newest.
// Data comes from the json_script block the server rendered (adaptation/sharding/pages.py).
(function () {
  "use strict";
  var runs = JSON.parse(document.getElementById("sharded-compare-data").textContent);
  Plotly.newPlot("decode-chart", [{
    type: "bar", x: runs.map(function (r) { return r.label; }),
    y: runs.map(function (r) { return r.decode_ms_per_step; }),
    marker: { color: runs.map(function (r) { return r.correct ? "#2955d9" : "#d92d20"; }) },
    hovertext: runs.map(function (r) { return r.correct ? "correct" : "incorrect"; })
  }], {
    height: 320, margin: { l: 60, r: 20, t: 20, b: 100 },
    yaxis: { title: { text: "ms per decode step (slowest rank)" } }
  }, { displaylogo: false, responsive: true });
})();
