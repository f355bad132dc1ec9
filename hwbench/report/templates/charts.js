// Clicking a legend entry hides or shows the marks of its series in the same chart.
document.querySelectorAll("svg.chart g.legend").forEach(function (entry) {
  entry.addEventListener("click", function () {
    var name = entry.getAttribute("data-series");
    entry.classList.toggle("off");
    entry.ownerSVGElement.querySelectorAll("g[data-series]:not(.legend)").forEach(function (group) {
      if (group.getAttribute("data-series") === name) { group.classList.toggle("hidden"); }
    });
  });
});
