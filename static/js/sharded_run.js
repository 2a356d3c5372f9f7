// Sharded run page: compute vs communication bars per rank, and for an MoE model the expert-load heatmap.
// All data comes from the json_script block the server rendered (adaptation/sharding/pages.py).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("sharded-run-data").textContent);
  var CONFIG = { displaylogo: false, responsive: true };

  function drawTimeSplit() {
    var labels = data.ranks.map(function (r) { return "rank " + r.rank + " (" + r.node + ")"; });
    var compute = { type: "bar", name: "compute", x: labels, marker: { color: "#2955d9" },
                    y: data.ranks.map(function (r) { return r.compute_s; }) };
    var collectives = { type: "bar", name: "collectives", x: labels, marker: { color: "#f79009" },
                        y: data.ranks.map(function (r) { return r.collective_s; }),
                        hovertext: data.ranks.map(function (r) { return r.collective_kinds; }) };
    Plotly.newPlot("time-split-chart", [compute, collectives], {
      barmode: "stack", height: 320, margin: { l: 60, r: 20, t: 20, b: 60 },
      yaxis: { title: { text: "seconds (prefill + decode)" } }, legend: { orientation: "h" }
    }, CONFIG);
  }

  function drawExpertLoad(routing) {
    var hover = routing.tokens.map(function (row, layer) {
      return row.map(function (count, expert) {
        return routing.layers[layer] + ", " + routing.experts[expert] + ": " + count + " tokens<br>layer imbalance " +
               (routing.imbalance[layer] === null ? "—" : routing.imbalance[layer].toFixed(2)) +
               (routing.ep_rank_imbalance[layer] ? ", per EP rank " + routing.ep_rank_imbalance[layer].toFixed(2) : "");
      });
    });
    Plotly.newPlot("expert-load-chart", [{
      type: "heatmap", z: routing.tokens, x: routing.experts, y: routing.layers, colorscale: [[0, "#f2f4f7"], [1, "#2955d9"]],
      text: hover, hoverinfo: "text", colorbar: { title: { text: "tokens" } }
    }], {
      height: Math.max(300, 120 + 40 * routing.layers.length), margin: { l: 80, r: 20, t: 20, b: 90 },
      yaxis: { autorange: "reversed" }
    }, CONFIG);
  }

  drawTimeSplit();
  if (data.routing) { drawExpertLoad(data.routing); }
})();
