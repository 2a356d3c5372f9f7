// Draws each sweep report's charts (the report page, the comparison, the self-contained download) from the
// plotly figures the server put in the report's json_script block, named by the grid's data-charts attribute.
document.querySelectorAll(".chart-grid[data-charts]").forEach((grid) => {
  const figures = JSON.parse(document.getElementById(grid.dataset.charts).textContent);
  grid.querySelectorAll("[data-chart]").forEach((element) => {
    const figure = figures[element.dataset.chart];
    Plotly.newPlot(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
  });
});
