// Model page charts: weights memory per precision, and parameters per component.
(function () {
  "use strict";
  var analysis = JSON.parse(document.getElementById("analysis-data").textContent);
  if (!analysis) { return; }
  var GIB = 1073741824;
  var precisions = Object.keys(analysis.weights_bytes);
  Plotly.newPlot("weights-chart", [{
    type: "bar", x: precisions, marker: { color: "#2955d9" },
    y: precisions.map(function (p) { return analysis.weights_bytes[p] / GIB; }),
    text: precisions.map(function (p) { return (analysis.weights_bytes[p] / GIB).toFixed(1) + " GiB"; }),
    textposition: "outside"
  }], { title: { text: "Weights memory per precision" }, height: 320, margin: { l: 60, r: 20, t: 40, b: 40 },
        yaxis: { title: { text: "GiB" } } }, { displaylogo: false, responsive: true });
  var names = Object.keys(analysis.components).filter(function (n) { return analysis.components[n] > 0; });
  Plotly.newPlot("components-chart", [{
    type: "bar", orientation: "h", y: names, marker: { color: "#7a5af8" },
    x: names.map(function (n) { return analysis.components[n] / 1e9; })
  }], { title: { text: "Parameters per component (billions)" }, height: 320,
        margin: { l: 120, r: 20, t: 40, b: 40 } }, { displaylogo: false, responsive: true });
})();
