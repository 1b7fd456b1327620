// Draws a plan page's charts from the JSON in <script id="plan-data">.
// Chart.js is served by the app (/static/chart.umd.min.js), never a CDN.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("plan-data").textContent);
  const chosenBorder = data.labels.map((_, i) => (i === data.chosen ? "#000000" : "rgba(0,0,0,0)"));
  const borderWidth = data.labels.map((_, i) => (i === data.chosen ? 3 : 0));
  const seconds = (v) => {
    if (v >= 1) return v.toPrecision(3) + " s";
    if (v >= 1e-3) return (v * 1e3).toPrecision(3) + " ms";
    if (v >= 1e-6) return (v * 1e6).toPrecision(3) + " us";
    return (v * 1e9).toPrecision(3) + " ns";
  };
  const bytes = (v) => {
    for (const [unit, size] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (Math.abs(v) >= size) return (v / size).toPrecision(3) + " " + unit;
    }
    return Math.round(v) + " B";
  };
  // Legend swatches without the chosen bar's outline (it is per bar, not per set).
  const legend = {
    labels: {
      generateLabels: (chart) =>
        Chart.defaults.plugins.legend.labels.generateLabels(chart).map((item) =>
          chart.data.datasets[item.datasetIndex].type === "line" ? item : Object.assign(item, { lineWidth: 0 })),
    },
  };
  const common = {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    interaction: { mode: "index", intersect: false },
  };

  const timeSets = [{
    label: "compute", data: data.compute, backgroundColor: "#999999",
    borderColor: chosenBorder, borderWidth: borderWidth, stack: "t",
  }];
  for (const axis of Object.keys(data.comm)) {
    timeSets.push({
      label: "communication over " + axis, data: data.comm[axis],
      backgroundColor: data.colours[axis] || "#444444",
      borderColor: chosenBorder, borderWidth: borderWidth, stack: "t",
    });
  }
  new Chart(document.getElementById("cost-chart"), {
    type: "bar",
    data: { labels: data.labels, datasets: timeSets },
    options: Object.assign({}, common, {
      scales: {
        x: { stacked: true },
        y: { stacked: true, title: { display: true, text: "step time" }, ticks: { callback: seconds } },
      },
      plugins: { legend, tooltip: { callbacks: { label: (c) => c.dataset.label + ": " + seconds(c.parsed.y) } } },
    }),
  });

  new Chart(document.getElementById("memory-chart"), {
    data: {
      labels: data.labels,
      datasets: [
        {
          type: "bar", label: "peak memory per device", data: data.peak,
          backgroundColor: data.peak.map((v) => (v > data.capacity ? "#D55E00" : "#009E73")),
          borderColor: chosenBorder, borderWidth: borderWidth,
        },
        {
          type: "line", label: "capacity", data: data.labels.map(() => data.capacity),
          borderColor: "#CC0000", borderDash: [6, 4], pointRadius: 0, fill: false,
        },
      ],
    },
    options: Object.assign({}, common, {
      scales: { y: { beginAtZero: true, title: { display: true, text: "bytes per device" }, ticks: { callback: bytes } } },
      plugins: { legend, tooltip: { callbacks: { label: (c) => c.dataset.label + ": " + bytes(c.parsed.y) } } },
    }),
  });
  document.body.dataset.chartsReady = "1";
})();
