// The job page: the live loss chart and events table (server-sent events from /jobs/ID/stream), and a chart
// for every metric of the history (/jobs/ID/metrics, read again while the job runs).
// No library, no inline script (the page's Content-Security-Policy allows scripts from 'self' only).
"use strict";
(function () {
  const chart = document.getElementById("chart");
  if (!chart) return;
  const NS = "http://www.w3.org/2000/svg";
  const box = { left: 50, top: 10, width: 570, height: 210 };
  const series = { loss: [], val_loss: [] };
  const live = document.getElementById("live");
  const state = document.getElementById("state");
  const step = document.getElementById("step");
  const plannedSteps = Number(chart.dataset.steps) || 1;

  function niceTicks(lo, hi, count) {
    const span = hi - lo || 1;
    const raw = span / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const unit = [1, 2, 5, 10].map(function (m) { return m * mag; }).find(function (u) { return span / u <= count; });
    const ticks = [];
    for (let t = Math.ceil(lo / unit) * unit; t <= hi + 1e-12; t += unit) ticks.push(t);
    return ticks;
  }

  function label(parent, x, y, text) {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.textContent = text;
    parent.appendChild(t);
  }

  function draw() {
    const all = series.loss.concat(series.val_loss).filter(function (p) { return p.value !== null; });
    if (!all.length) return;
    const maxStep = Math.max(plannedSteps, ...all.map(function (p) { return p.step; }));
    let lo = Math.min(...all.map(function (p) { return p.value; }));
    let hi = Math.max(...all.map(function (p) { return p.value; }));
    if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
    const x = function (s) { return box.left + (s / maxStep) * box.width; };
    const y = function (v) { return box.top + box.height - ((v - lo) / (hi - lo)) * box.height; };
    for (const name of Object.keys(series)) {
      const points = series[name].filter(function (p) { return p.value !== null; })
        .map(function (p) { return x(p.step).toFixed(1) + "," + y(p.value).toFixed(1); });
      document.getElementById("line-" + name).setAttribute("points", points.join(" "));
    }
    const grid = document.getElementById("grid"), yaxis = document.getElementById("yaxis"),
      xaxis = document.getElementById("xaxis");
    grid.replaceChildren(); yaxis.replaceChildren(); xaxis.replaceChildren();
    for (const v of niceTicks(lo, hi, 5)) {
      const line = document.createElementNS(NS, "line");
      line.setAttribute("x1", box.left); line.setAttribute("x2", box.left + box.width);
      line.setAttribute("y1", y(v)); line.setAttribute("y2", y(v));
      grid.appendChild(line);
      label(yaxis, box.left - 6, y(v) + 4, Number(v.toPrecision(4)).toString());
    }
    for (const s of niceTicks(0, maxStep, 8)) label(xaxis, x(s), box.top + box.height + 16, String(s));
  }

  const events = document.querySelector("#events tbody");
  const EVENTS_SHOWN = 200;

  function addEvent(row) {
    const tr = document.createElement("tr");
    for (const value of [row.seq, row.time, row.kind, row.worker, row.step, row.what]) {
      const td = document.createElement("td");
      td.textContent = String(value);
      tr.appendChild(td);
    }
    events.insertBefore(tr, events.firstChild);
    while (events.rows.length > EVENTS_SHOWN) events.deleteRow(-1);
  }

  function apply(updates) {
    const shown = new Set(Array.from(events.rows, function (r) { return r.cells[0].textContent; }));
    for (const u of updates) {
      if (u.event !== undefined) {
        if (!shown.has(String(u.event.seq))) addEvent(u.event);  // the table as loaded holds the first ones
      } else if (u.state !== undefined) {
        state.textContent = u.state;
        state.className = "state state-" + u.state.toLowerCase();
      } else {
        series[u.series].push(u);
        if (u.series === "loss") step.textContent = String(u.step);
      }
    }
    draw();
    chart.dataset.points = String(series.loss.length + series.val_loss.length);
    chart.dispatchEvent(new CustomEvent("chart-updated", { detail: updates.length }));
  }

  // One chart per metric name, one line per worker process; read again every REFRESH_MS until the job has ended.
  const metrics = document.getElementById("metrics");
  const REFRESH_MS = 2000;
  const charts = {};  // name -> {draw, workers: {worker: [[step, value]]}}
  let cursor = 0;

  async function refreshMetrics() {
    try {
      const read = await CantataCharts.history(metrics.dataset.source, cursor);
      cursor = read.cursor;
      const changed = new Set();
      for (const [name, worker, s, value] of read.points) {
        if (!charts[name]) charts[name] = { draw: CantataCharts.chart(metrics, name, read.descriptions[name]), workers: {} };
        (charts[name].workers[worker] = charts[name].workers[worker] || []).push([s, value]);
        changed.add(name);
      }
      for (const name of changed) {
        const workers = charts[name].workers;
        charts[name].draw(Object.keys(workers).map(function (w, i) {
          return { label: "worker " + w, colour: CantataCharts.COLOURS[i % CantataCharts.COLOURS.length], points: workers[w] };
        }));
      }
      metrics.dataset.charts = String(Object.keys(charts).length);
      metrics.dataset.cursor = String(cursor);
      if (read.terminal) { metrics.dataset.final = "true"; return; }  // the end was read before the history
    } catch (e) {
      document.getElementById("metrics-note").textContent = "Metrics could not be read (" + e.message + "); trying again.";
    }
    setTimeout(refreshMetrics, REFRESH_MS);
  }
  refreshMetrics();

  const source = new EventSource(chart.dataset.stream);
  source.addEventListener("open", function () { live.textContent = "live"; });
  source.addEventListener("updates", function (e) { apply(JSON.parse(e.data)); });
  source.addEventListener("end", function () {
    source.close();
    live.textContent = "ended";
    chart.dataset.ended = "true";
  });
  source.addEventListener("signed-out", function () {
    source.close();
    live.textContent = "signed out: ask `cantata dashboard` for a new link";
  });
  source.addEventListener("error", function () {
    if (source.readyState !== EventSource.CLOSED) live.textContent = "reconnecting…";
  });
})();
