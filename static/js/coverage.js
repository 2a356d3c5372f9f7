// Coverage heatmap: models (rows) × backends (columns); click a cell to open the model's gap table.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("heatmap-data").textContent);
  if (!data.models.length) { document.getElementById("coverage-heatmap").hidden = true; return; }
  var text = data.coverage.map(function (row) {
    return row.map(function (v) { return v === null ? "—" : (v * 100).toFixed(1) + "%"; });
  });
  var element = document.getElementById("coverage-heatmap");
  Plotly.newPlot(element, [{
    type: "heatmap", x: data.backends, y: data.models, z: data.coverage, text: text, texttemplate: "%{text}",
    zmin: 0, zmax: 1, colorscale: [[0, "#d92d20"], [0.8, "#f79009"], [1, "#12b76a"]],
    hovertemplate: "%{y} on %{x}: %{text}<extra></extra>", colorbar: { title: { text: "coverage" } }
  }], { height: Math.max(260, 60 + 40 * data.models.length), margin: { l: 200, r: 20, t: 20, b: 80 } },
  { displaylogo: false, responsive: true });
  element.on("plotly_click", function (event) {
    var id = data.model_ids[event.points[0].y];
    if (id) { window.location.href = "/models/" + id + "/coverage/"; }
  });
})();
