// Cluster topology page: a graph of nodes, devices and links, a device table, and measured-vs-peak bars.
// All data comes from the json_script block the server rendered (the same JSON as /api/clusters/<id>/topology/).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("topology-data").textContent);
  var LINK_COLOURS = { nvlink: "#12b76a", xgmi: "#7a5af8", pcie: "#f79009", rdma: "#2955d9", ethernet: "#667085",
                       loopback: "#0ba5ec", unknown: "#98a2b3" };
  var devices = {};
  data.nodes.forEach(function (node) { node.devices.forEach(function (d) { devices[d.id] = d; }); });

  function fmt(value, scale, unit) {
    return value === null || value === undefined ? "—" : (value / scale).toFixed(2) + " " + unit;
  }

  // A measured median with the max/min of its repetitions, when the env check recorded them.
  function withSpread(text, ratio) {
    return ratio ? text + " (max/min " + ratio.toFixed(2) + "×)" : text;
  }

  // Layout: nodes on a row; each node's devices on a circle around it.
  function layout() {
    var positions = {};
    data.nodes.forEach(function (node, column) {
      var cx = column * 4, count = node.devices.length;
      positions["node-" + node.id] = [cx, 0];
      node.devices.forEach(function (device, i) {
        var angle = (2 * Math.PI * i) / Math.max(count, 1) + Math.PI / 2;
        var radius = count > 1 ? 1.4 : 1.0;
        positions[device.id] = [cx + radius * Math.cos(angle), radius * Math.sin(angle)];
      });
    });
    return positions;
  }

  function drawGraph() {
    var at = layout(), traces = [];
    // Membership edges: node to each of its devices.
    var member = { x: [], y: [], mode: "lines", line: { color: "#d0d5dd", width: 1 }, hoverinfo: "skip",
                   showlegend: false, type: "scatter" };
    data.nodes.forEach(function (node) {
      node.devices.forEach(function (d) {
        member.x.push(at["node-" + node.id][0], at[d.id][0], null);
        member.y.push(at["node-" + node.id][1], at[d.id][1], null);
      });
    });
    traces.push(member);
    // One trace per link kind, so the legend names the colours.
    var byKind = {}, labels = { x: [], y: [], text: [], mode: "text", type: "scatter", showlegend: false,
                                textfont: { size: 11 }, hoverinfo: "skip" };
    data.links.forEach(function (link) {
      var a = at[link.source], b = at[link.target];
      if (!a || !b) { return; }
      var trace = byKind[link.kind] = byKind[link.kind] || { x: [], y: [], mode: "lines", type: "scatter",
        name: link.kind, line: { color: LINK_COLOURS[link.kind] || "#98a2b3", width: 3 }, hoverinfo: "name" };
      var label = (link.code || link.kind) + (link.measured_gbps ? " · " + link.measured_gbps.toFixed(1) + " GB/s" : "");
      if (link.source === link.target) {  // a loopback: a small ring beside the device
        for (var t = 0; t <= 24; t++) {
          trace.x.push(a[0] + 0.35 + 0.3 * Math.cos(t * Math.PI / 12));
          trace.y.push(a[1] + 0.3 * Math.sin(t * Math.PI / 12));
        }
        trace.x.push(null); trace.y.push(null);
        labels.x.push(a[0] + 0.65); labels.y.push(a[1] + 0.45); labels.text.push(label);
      } else {
        trace.x.push(a[0], b[0], null); trace.y.push(a[1], b[1], null);
        labels.x.push((a[0] + b[0]) / 2); labels.y.push((a[1] + b[1]) / 2); labels.text.push(label);
      }
    });
    Object.keys(byKind).forEach(function (kind) { traces.push(byKind[kind]); });
    traces.push(labels);
    traces.push({
      type: "scatter", mode: "markers+text", name: "nodes", textposition: "top center",
      x: data.nodes.map(function (n) { return at["node-" + n.id][0]; }),
      y: data.nodes.map(function (n) { return at["node-" + n.id][1]; }),
      text: data.nodes.map(function (n) { return n.hostname; }),
      marker: { size: 26, symbol: "square", color: data.nodes.map(function (n) {
        var v = n.latest_env_check && n.latest_env_check.verdict;
        return v === "fail" ? "#d92d20" : v === "warn" ? "#f79009" : v === "pass" ? "#12b76a" : "#98a2b3"; }) },
      hovertext: data.nodes.map(function (n) {
        return n.hostname + " (" + n.status + ")<br>env check: " + (n.latest_env_check ? n.latest_env_check.verdict : "none"); }),
      hoverinfo: "text"
    });
    var all = [];
    data.nodes.forEach(function (n) { all = all.concat(n.devices); });
    traces.push({
      type: "scatter", mode: "markers+text", name: "devices", textposition: "bottom center",
      x: all.map(function (d) { return at[d.id][0]; }), y: all.map(function (d) { return at[d.id][1]; }),
      text: all.map(function (d) { return d.kind + ":" + d.index; }),
      marker: { size: 16, color: "#2955d9" },
      hovertext: all.map(function (d) { return d.label + "<br>" + d.name + "<br>" + fmt(d.memory_bytes, 1073741824, "GiB"); }),
      hoverinfo: "text"
    });
    Plotly.newPlot("topology-graph", traces, {
      height: 420, margin: { l: 20, r: 20, t: 20, b: 20 }, hovermode: "closest",
      xaxis: { visible: false }, yaxis: { visible: false, scaleanchor: "x" }, legend: { orientation: "h" }
    }, { displaylogo: false, responsive: true });
  }

  function drawTable() {
    var body = document.querySelector("#device-table tbody");
    Object.keys(devices).forEach(function (id) {
      var d = devices[id], m = d.measured || {}, peak = d.published_peak, flops = m.matmul_flops_per_s || {};
      var spread = m.max_over_min || {};
      var cells = [d.label, d.name, fmt(d.memory_bytes, 1073741824, "GiB"), fmt(m.free_memory_bytes, 1073741824, "GiB"),
                   withSpread(fmt(m.copy_bandwidth_bytes_per_s, 1e9, "GB/s"), spread.copy_bandwidth),
                   withSpread(fmt(flops.bf16, 1e12, "TFLOP/s"), spread.bf16),
                   withSpread(fmt(flops.fp32, 1e12, "TFLOP/s"), spread.fp32),
                   peak ? peak.matched + ": " + fmt(peak.memory_bandwidth, 1e12, "TB/s") + ", " +
                          fmt(peak.bf16_flops, 1e12, "TFLOP/s") : "not in the table"];
      var row = document.createElement("tr");
      cells.forEach(function (text) { var td = document.createElement("td"); td.textContent = text; row.appendChild(td); });
      body.appendChild(row);
    });
  }

  function drawBars(element, title, measuredOf, peakOf, scale, unit) {
    var list = Object.keys(devices).map(function (id) { return devices[id]; });
    var names = list.map(function (d) { return d.label; });
    var measured = { type: "bar", name: "measured", x: names, marker: { color: "#2955d9" },
                     y: list.map(function (d) { var v = measuredOf(d.measured || {}); return v ? v / scale : null; }) };
    var peak = { type: "bar", name: "published peak", x: names, marker: { color: "#d0d5dd" },
                 y: list.map(function (d) { var v = d.published_peak && peakOf(d.published_peak); return v ? v / scale : null; }) };
    Plotly.newPlot(element, [measured, peak], {
      title: { text: title }, barmode: "group", height: 320, margin: { l: 60, r: 20, t: 40, b: 80 },
      yaxis: { title: { text: unit } }
    }, { displaylogo: false, responsive: true });
  }

  drawGraph();
  drawTable();
  drawBars("bandwidth-chart", "Memory copy bandwidth", function (m) { return m.copy_bandwidth_bytes_per_s; },
           function (p) { return p.memory_bandwidth; }, 1e9, "GB/s");
  drawBars("flops-chart", "bf16 matmul throughput", function (m) { return (m.matmul_flops_per_s || {}).bf16; },
           function (p) { return p.bf16_flops; }, 1e12, "TFLOP/s");
})();
