// The compare page: each job's metrics history (worker 0) overlaid, one chart per metric, one colour per job.
"use strict";
(async function () {
  const container = document.getElementById("compare");
  const ids = Array.from(document.querySelectorAll("#compared tbody tr"), function (tr) { return tr.dataset.job; });
  const reads = await Promise.all(ids.map(function (id) { return CantataCharts.history("/jobs/" + id + "/metrics", 0); }));
  const names = [];
  const descriptions = {};
  for (const read of reads) {
    Object.assign(descriptions, read.descriptions);
    for (const [name, worker] of read.points) if (worker === 0 && !names.includes(name)) names.push(name);
  }
  for (const name of names) {
    const draw = CantataCharts.chart(container, name, descriptions[name]);
    draw(ids.map(function (id, i) {
      return {
        label: id,
        colour: CantataCharts.COLOURS[i % CantataCharts.COLOURS.length],
        points: reads[i].points.filter(function (p) { return p[0] === name && p[1] === 0; })
          .map(function (p) { return [p[2], p[3]]; }),
      };
    }));
  }
  container.dataset.charts = String(names.length);
})();
