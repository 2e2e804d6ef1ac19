// Line charts drawn into SVG, shared by the job and compare pages. No library, no inline script
// (the pages' Content-Security-Policy allows scripts from 'self' only); every text is set as text.
"use strict";
window.CantataCharts = (function () {
  const NS = "http://www.w3.org/2000/svg";
  const COLOURS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#0598bc", "#bf3989", "#57606a"];
  const box = { left: 56, top: 8, width: 260, height: 120 };

  function el(name, attributes, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function niceTicks(lo, hi, count) {
    const span = hi - lo || 1;
    const mag = Math.pow(10, Math.floor(Math.log10(span / count)));
    const unit = [1, 2, 5, 10].map(function (m) { return m * mag; }).find(function (u) { return span / u <= count; });
    const ticks = [];
    for (let t = Math.ceil(lo / unit) * unit; t <= hi + 1e-12; t += unit) ticks.push(t);
    return ticks;
  }

  function short(v, digits) {
    const a = Math.abs(v);
    if (a >= 1e9) return Number((v / 1e9).toPrecision(digits)) + "G";
    if (a >= 1e6) return Number((v / 1e6).toPrecision(digits)) + "M";
    if (a >= 1e4) return Number((v / 1e3).toPrecision(digits)) + "k";
    return Number(v.toPrecision(digits)).toString();
  }

  // Tick labels with as few digits as tell them apart.
  function labels(ticks) {
    for (let digits = 3; digits < 12; digits++) {
      const texts = ticks.map(function (t) { return short(t, digits); });
      if (new Set(texts).size === texts.length) return texts;
    }
    return ticks.map(String);
  }

  // A chart of one metric in `container`: returns draw(lines), lines being [{label, colour, points: [[step, v]]}].
  function chart(container, name, description) {
    const figure = document.createElement("figure");
    figure.className = "metric";
    figure.id = "metric-" + name;
    const svg = el("svg", { viewBox: "0 0 330 150", role: "img", "aria-label": name + " by step" }, figure);
    const caption = document.createElement("figcaption");
    const title = document.createElement("b");
    title.textContent = name;
    caption.appendChild(title);
    caption.title = description || "";
    const keys = document.createElement("span");
    keys.className = "keys";
    caption.appendChild(keys);
    figure.appendChild(caption);
    container.appendChild(figure);

    return function draw(lines) {
      svg.replaceChildren();
      el("rect", { x: box.left, y: box.top, width: box.width, height: box.height, fill: "none", stroke: "#d0d7de" }, svg);
      const all = [].concat(...lines.map(function (l) { return l.points; })).filter(function (p) { return p[1] !== null; });
      figure.dataset.points = String(all.length);
      figure.dataset.lines = String(lines.length);
      keys.replaceChildren();
      for (const line of lines) {
        const key = document.createElement("span");
        key.className = "legend";
        key.style.borderColor = line.colour;
        key.textContent = line.label;
        keys.appendChild(key);
      }
      if (!all.length) return;
      const maxStep = Math.max(1, ...all.map(function (p) { return p[0]; }));
      let lo = Math.min(...all.map(function (p) { return p[1]; }));
      let hi = Math.max(...all.map(function (p) { return p[1]; }));
      if (hi - lo < 1e-12 * Math.max(1, Math.abs(hi))) { lo -= Math.abs(lo) * 0.1 || 0.5; hi += Math.abs(hi) * 0.1 || 0.5; }
      const x = function (s) { return box.left + (s / maxStep) * box.width; };
      const y = function (v) { return box.top + box.height - ((v - lo) / (hi - lo)) * box.height; };
      const axis = el("g", { "font-size": "10", fill: "#57606a" }, svg);
      const ticks = niceTicks(lo, hi, 4);
      labels(ticks).forEach(function (text, i) {
        const v = ticks[i];
        el("line", { x1: box.left, x2: box.left + box.width, y1: y(v), y2: y(v), stroke: "#eef1f4" }, svg);
        el("text", { x: box.left - 4, y: y(v) + 3, "text-anchor": "end" }, axis).textContent = text;
      });
      for (const s of niceTicks(0, maxStep, 5).filter(Number.isInteger)) {  // steps are whole
        el("text", { x: x(s), y: box.top + box.height + 13, "text-anchor": "middle" }, axis).textContent = String(s);
      }
      for (const line of lines) {
        const points = line.points.filter(function (p) { return p[1] !== null; })
          .map(function (p) { return x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1); });
        const drawn = el("polyline", { fill: "none", stroke: line.colour, "stroke-width": "1.5", points: points.join(" ") }, svg);
        drawn.dataset.label = line.label;
        if (points.length === 1) {
          const [cx, cy] = points[0].split(",");
          el("circle", { cx: cx, cy: cy, r: "2.5", fill: line.colour }, svg);
        }
      }
    };
  }

  // The metrics endpoint's points after `cursor`, all of them (it answers in pages): {cursor, points, descriptions}.
  async function history(source, cursor) {
    const result = { cursor: cursor, points: [], descriptions: {}, state: "", terminal: false };
    for (;;) {
      const response = await fetch(source + "?after=" + result.cursor, { credentials: "same-origin" });
      if (!response.ok) throw new Error(source + ": " + response.status);
      const page = await response.json();
      result.cursor = page.cursor;
      result.points.push(...page.points);
      Object.assign(result.descriptions, page.descriptions);
      result.state = page.state;
      result.terminal = page.terminal;
      if (!page.more) return result;
    }
  }

  return { chart: chart, history: history, COLOURS: COLOURS };
})();
