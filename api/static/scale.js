// Draws a scale plan page's charts from the JSON in <script id="scale-data">:
// the step's parts as one stacked bar, and each recomputation option's step
// time and peak memory on the chosen mesh.  Chart.js is served by the app;
// nothing is written into the page as HTML.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("scale-data").textContent);
  const seconds = (v) => {
    if (v === 0) return "0 s";
    if (Math.abs(v) >= 1) return v.toPrecision(3) + " s";
    if (Math.abs(v) >= 1e-3) return (v * 1e3).toPrecision(3) + " ms";
    if (Math.abs(v) >= 1e-6) return (v * 1e6).toPrecision(3) + " us";
    return (v * 1e9).toPrecision(3) + " ns";
  };
  const bytes = (v) => {
    for (const [unit, size] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (Math.abs(v) >= size) return (v / size).toPrecision(3) + " " + unit;
    }
    return Math.round(v) + " B";
  };
  const colours = ["#0072B2", "#E69F00", "#999999", "#009E73"];
  const common = { animation: false, responsive: true, maintainAspectRatio: false };

  new Chart(document.getElementById("parts-chart"), {
    type: "bar",
    data: {
      labels: ["step"],
      datasets: Object.keys(data.parts).map((name, i) => ({
        label: name, data: [data.parts[name]], backgroundColor: colours[i % colours.length], stack: "s",
      })),
    },
    options: Object.assign({}, common, {
      indexAxis: "y",
      scales: {
        x: { stacked: true, beginAtZero: true, title: { display: true, text: "seconds" }, ticks: { callback: seconds } },
        y: { stacked: true },
      },
      plugins: { tooltip: { callbacks: { label: (c) => c.dataset.label + ": " + seconds(c.parsed.x) } } },
    }),
  });

  const outline = data.options.map((_, i) => (i === data.chosen ? "#000000" : "rgba(0,0,0,0)"));
  const width = data.options.map((_, i) => (i === data.chosen ? 3 : 0));
  new Chart(document.getElementById("options-chart"), {
    type: "bar",
    data: {
      labels: data.options,
      datasets: [
        { label: "step time", data: data.option_time_s, backgroundColor: "#0072B2", borderColor: outline, borderWidth: width, yAxisID: "t" },
        {
          label: "peak memory per device", data: data.option_peak_bytes,
          backgroundColor: data.option_peak_bytes.map((v) => (v > data.capacity ? "#D55E00" : "#009E73")),
          borderColor: outline, borderWidth: width, yAxisID: "m",
        },
      ],
    },
    options: Object.assign({}, common, {
      scales: {
        t: { position: "left", beginAtZero: true, title: { display: true, text: "step time" }, ticks: { callback: seconds } },
        m: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "bytes per device" }, ticks: { callback: bytes } },
      },
      plugins: {
        tooltip: { callbacks: { label: (c) => c.dataset.label + ": " + (c.dataset.yAxisID === "t" ? seconds(c.parsed.y) : bytes(c.parsed.y)) } },
      },
    }),
  });
  document.body.dataset.chartsReady = "1";
})();
