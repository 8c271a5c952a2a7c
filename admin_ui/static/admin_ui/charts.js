// The dashboard's charts: per served model, the last 15 minutes of tokens per second, time to first token (p50 and
// p99), queue depth, KV blocks in use and refusals per second. The points come from the control plane's history of
// its own metrics (GET data-url, JSON: inference/runtime/metrics_history.py), polled at the history's interval;
// uPlot (vendor/, no build step) draws them. A model's charts appear when it is served and go when it is not.
(() => {
  const root = document.getElementById("charts");
  if (!root || !window.uPlot) return;

  // One chart per quantity: [the JSON's series name, legend label, colour] for each line.
  const CHARTS = [
    { key: "tokens", title: "Tokens / s", lines: [["tokens_per_s", "tokens/s", "#2456c5"]] },
    { key: "ttft", title: "Time to first token (s)",
      lines: [["ttft_p50_s", "p50", "#1f7a3a"], ["ttft_p99_s", "p99", "#b3261e"]] },
    { key: "queue", title: "Queue depth", lines: [["queue_depth", "waiting", "#8a5a00"]] },
    { key: "kv", title: "KV blocks in use", lines: [["kv_blocks_used", "blocks", "#6a3fb5"]] },
    { key: "refusals", title: "Refusals / s", lines: [["refusals_per_s", "refused/s", "#b3261e"]] },
  ];
  const HEIGHT = 150;
  const shown = new Map(); // model -> {section, plots: {chart key -> uPlot}}
  window.pantheonCharts = shown; // what is drawn, for a look from the browser's console (and the UI tests)
  let windowS = 900;

  const format = (v) => (v == null ? "–" : Math.abs(v) >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(3))));
  const latest = (values) => {
    for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
    return null;
  };

  function plot(target, chart) {
    const options = {
      width: Math.max(target.clientWidth, 200),
      height: HEIGHT,
      legend: { live: false },
      scales: {
        // Always the whole window, ending at the newest point, so a model served for a minute looks it.
        x: { time: true, range: (u, min, max) => [(max ?? Date.now() / 1000) - windowS, max ?? Date.now() / 1000] },
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] },
      },
      axes: [{}, { size: 48, values: (u, ticks) => ticks.map(format) }],
      series: [{}, ...chart.lines.map(([, label, stroke]) => ({ label, stroke, width: 2, value: (u, v) => format(v) }))],
    };
    const u = new uPlot(options, [[], ...chart.lines.map(() => [])], target);
    new ResizeObserver(() => u.setSize({ width: Math.max(target.clientWidth, 200), height: HEIGHT })).observe(target);
    return u;
  }

  function sectionFor(model) {
    const section = document.createElement("section");
    section.className = "card model-charts";
    section.dataset.model = model;
    const heading = document.createElement("h3");
    heading.textContent = model;
    const grid = document.createElement("div");
    grid.className = "chart-grid";
    section.append(heading, grid);
    root.append(section);
    const plots = {};
    for (const chart of CHARTS) {
      const figure = document.createElement("figure");
      figure.className = "chart";
      figure.dataset.chart = chart.key;
      const caption = document.createElement("figcaption");
      caption.innerHTML = `${chart.title} <span class="now"></span>`;
      const target = document.createElement("div");
      figure.append(caption, target);
      grid.append(figure);
      plots[chart.key] = plot(target, chart);
    }
    return { section, plots };
  }

  function draw(data) {
    windowS = data.window_s ?? windowS;
    for (const [model, series] of Object.entries(data.models)) {
      if (!shown.has(model)) shown.set(model, sectionFor(model));
      const { section, plots } = shown.get(model);
      for (const chart of CHARTS) {
        const lines = chart.lines.map(([name]) => series[name]);
        plots[chart.key].setData([data.t, ...lines]);
        section.querySelector(`[data-chart=${chart.key}] .now`).textContent =
          "now " + chart.lines.map(([, label], i) => `${chart.lines.length > 1 ? label + " " : ""}${format(latest(lines[i]))}`).join(" · ");
      }
    }
    for (const [model, { section, plots }] of shown) {
      if (model in data.models) continue;
      Object.values(plots).forEach((u) => u.destroy());
      section.remove();
      shown.delete(model);
    }
    root.querySelector(".charts-empty").hidden = shown.size > 0;
  }

  async function poll() {
    let delayS = 5;
    try {
      const response = await fetch(root.dataset.url, { headers: { Accept: "application/json" } });
      // Signed out, the answer is the sign-in page: nothing to draw.
      if (response.ok && response.headers.get("content-type")?.startsWith("application/json")) {
        const data = await response.json();
        draw(data);
        delayS = data.interval_s ?? delayS;
      }
    } catch {
      // the server is away for a moment: the charts keep what they show, and the next poll tries again
    } finally {
      setTimeout(poll, Math.max(delayS, 1) * 1000);
    }
  }
  poll();
})();
