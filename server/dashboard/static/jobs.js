// The job list: search, filter by state, sort by a column, pick jobs to compare, and refresh from /jobs.json.
"use strict";
(function () {
  const table = document.getElementById("jobs");
  const body = table.tBodies[0];
  const search = document.getElementById("filter");
  const stateFilter = document.getElementById("state-filter");
  const compare = document.getElementById("compare-link");
  const none = document.getElementById("no-jobs");
  const refreshed = document.getElementById("refreshed");
  const REFRESH_MS = 3000;
  let jobs = null;  // the latest /jobs.json; until the first read, the rows the server rendered
  let sortKey = null, sortDir = 1;
  const picked = new Set();

  function cell(tr, text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    if (text !== undefined) td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  function fixed(v) { return v === null ? "–" : v.toFixed(4); }

  function row(j) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    const box = document.createElement("input");
    box.type = "checkbox"; box.className = "pick"; box.value = j.id; box.checked = picked.has(j.id);
    box.setAttribute("aria-label", "compare " + j.id);
    cell(tr).appendChild(box);
    const link = document.createElement("a");
    link.href = "/jobs/" + encodeURIComponent(j.id); link.textContent = j.id;
    cell(tr).appendChild(link);
    cell(tr, j.name, "name");
    const state = document.createElement("span");
    state.className = "state state-" + j.state.toLowerCase(); state.textContent = j.state;
    cell(tr).appendChild(state);
    cell(tr, j.step + " / " + j.steps);
    cell(tr, fixed(j.loss));
    cell(tr, fixed(j.val_loss));
    cell(tr, j.duration);
    cell(tr, j.eta);
    cell(tr, j.algorithm + " × " + j.workers);
    const tags = cell(tr);
    for (const t of j.tags) {
      const tag = document.createElement("span");
      tag.className = "tag"; tag.textContent = t;
      tags.appendChild(tag);
    }
    cell(tr, j.created);
    return tr;
  }

  function matches(j) {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const text = [j.id, j.name, j.state, j.algorithm].concat(j.tags).join(" ").toLowerCase();
    return (!stateFilter.value || j.state === stateFilter.value) && words.every(function (w) { return text.includes(w); });
  }

  function compareKey(a, b) {
    const x = a[sortKey], y = b[sortKey];
    if (x === y) return 0;
    if (x === null) return 1;  // no value: last, either way
    if (y === null) return -1;
    return (x < y ? -1 : 1) * sortDir;
  }

  function render() {
    if (jobs === null) return;
    const shown = jobs.filter(matches);
    if (sortKey) shown.sort(compareKey);
    body.replaceChildren(...shown.map(row));
    none.hidden = shown.length > 0;
    table.dataset.rows = String(shown.length);
  }

  function updateCompare() {
    const ids = Array.from(picked);
    compare.href = "/compare?jobs=" + ids.map(encodeURIComponent).join(",");
    compare.classList.toggle("disabled", ids.length < 2);
    compare.dataset.picked = String(ids.length);
  }

  async function refresh() {
    try {
      const response = await fetch(table.dataset.source, { credentials: "same-origin" });
      if (response.ok) {
        jobs = (await response.json()).jobs;
        render();
        table.dataset.refreshed = String(Number(table.dataset.refreshed || 0) + 1);
        refreshed.textContent = "updated " + new Date().toLocaleTimeString();
      } else {
        refreshed.textContent = response.status === 401 ? "signed out: ask `cantata dashboard` for a new link" : "refresh failed (" + response.status + ")";
        if (response.status === 401) return;
      }
    } catch (e) {
      refreshed.textContent = "refresh failed; trying again";
    }
    setTimeout(refresh, REFRESH_MS);
  }

  search.addEventListener("input", render);
  stateFilter.addEventListener("change", render);
  body.addEventListener("change", function (e) {
    if (!e.target.classList.contains("pick")) return;
    if (e.target.checked) picked.add(e.target.value); else picked.delete(e.target.value);
    updateCompare();
  });
  for (const th of table.tHead.querySelectorAll("th[data-sort]")) {
    th.classList.add("sortable");
    th.addEventListener("click", function () {
      sortDir = sortKey === th.dataset.sort ? -sortDir : 1;
      sortKey = th.dataset.sort;
      for (const other of table.tHead.querySelectorAll("th")) other.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      render();
    });
  }
  updateCompare();
  refresh();
})();
