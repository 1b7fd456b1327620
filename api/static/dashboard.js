// Draws a plan page's charts from the JSON in <script id="plan-data">, switches
// them between a linear and a logarithmic scale, and fills the side-by-side
// table of two layouts.  Chart.js is served by the app, never a CDN.  Text goes
// into the page only through textContent (never innerHTML).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("plan-data").textContent);
  const chosenBorder = data.labels.map((_, i) => (i === data.chosen ? "#000000" : "rgba(0,0,0,0)"));
  const borderWidth = data.labels.map((_, i) => (i === data.chosen ? 3 : 0));
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
  // Legend swatches without the chosen bar's outline (it is per bar, not per set).
  const legend = {
    labels: {
      generateLabels: (chart) =>
        Chart.defaults.plugins.legend.labels.generateLabels(chart).map((item) =>
          chart.data.datasets[item.datasetIndex].type === "line" ? item : Object.assign(item, { lineWidth: 0 })),
    },
  };
  // Tooltips title a bar with its whole label, every line of it.
  const title = (items) => (items.length ? data.labels[items[0].dataIndex].join(" ") : "");
  const common = {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    interaction: { mode: "index", intersect: false },
    layout: { padding: { bottom: 4 } },
  };
  // Labels are lists of lines: Chart.js draws each line, none is cut.
  const xAxis = (stacked) => ({ stacked, ticks: { autoSkip: false, maxRotation: 0, minRotation: 0, font: { size: 11 } } });

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
  const costChart = new Chart(document.getElementById("cost-chart"), {
    type: "bar",
    data: { labels: data.labels, datasets: timeSets },
    options: Object.assign({}, common, {
      scales: {
        x: xAxis(true),
        y: { type: "linear", stacked: true, title: { display: true, text: "step time" }, ticks: { callback: seconds } },
      },
      plugins: { legend, tooltip: { callbacks: { title, label: (c) => c.dataset.label + ": " + seconds(c.parsed.y) } } },
    }),
  });

  const memoryChart = new Chart(document.getElementById("memory-chart"), {
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
      scales: {
        x: xAxis(false),
        y: { type: "linear", beginAtZero: true, title: { display: true, text: "bytes per device" }, ticks: { callback: bytes } },
      },
      plugins: { legend, tooltip: { callbacks: { title, label: (c) => c.dataset.label + ": " + bytes(c.parsed.y) } } },
    }),
  });

  // Linear or logarithmic: a 1000x spread between candidates and baselines
  // leaves the small bars invisible on a linear scale.
  const logBox = document.getElementById("log-scale");
  const applyScale = () => {
    const type = logBox.checked ? "logarithmic" : "linear";
    for (const chart of [costChart, memoryChart]) {
      chart.options.scales.y.type = type;
      chart.options.scales.y.beginAtZero = type === "linear";
      chart.update();
    }
    document.body.dataset.scale = type;
  };
  logBox.addEventListener("change", applyScale);
  applyScale();

  // Two layouts side by side: where each dim goes, and what it costs.
  const selA = document.getElementById("diff-a");
  const selB = document.getElementById("diff-b");
  const body = document.querySelector("#diff tbody");
  const cell = (row, text, cls) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  };
  const line = (name, a, b, fmt, delta) => {
    const tr = document.createElement("tr");
    cell(tr, name);
    cell(tr, fmt(a), "num");
    cell(tr, fmt(b), "num");
    const d = b - a;
    cell(tr, delta ? (d > 0 ? "+" : d < 0 ? "-" : "") + fmt(Math.abs(d)) : "", "num" + (d > 0 ? " worse" : d < 0 ? " better" : ""));
    body.appendChild(tr);
  };
  const diff = () => {
    const a = data.rows[Number(selA.value)];
    const b = data.rows[Number(selB.value)];
    document.getElementById("diff-a-name").textContent = a.name;
    document.getElementById("diff-b-name").textContent = b.name;
    body.replaceChildren();
    for (const dim of data.dims) {
      const tr = document.createElement("tr");
      const ax = a.rules[dim] || "whole";
      const bx = b.rules[dim] || "whole";
      cell(tr, dim);
      cell(tr, ax, "num");
      cell(tr, bx, "num");
      cell(tr, ax === bx ? "" : "differs", "num");
      if (ax !== bx) tr.className = "differs";
      tr.dataset.dim = dim;
      body.appendChild(tr);
    }
    line("step time", a.time_s, b.time_s, seconds, true);
    line("compute", a.compute_s, b.compute_s, seconds, true);
    const axes = new Set([...Object.keys(a.comm_s_by_axis), ...Object.keys(b.comm_s_by_axis)]);
    for (const axis of [...axes].sort()) {
      line("communication over " + axis, a.comm_s_by_axis[axis] || 0, b.comm_s_by_axis[axis] || 0, seconds, true);
    }
    line("peak memory / device", a.peak_memory_bytes, b.peak_memory_bytes, bytes, true);
  };
  selA.addEventListener("change", diff);
  selB.addEventListener("change", diff);
  diff();
  document.body.dataset.chartsReady = "1";
})();
