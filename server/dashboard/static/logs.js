// The logs tab: the job's worker log lines from /jobs/ID/logs/stream (server-sent events), appended as text.
"use strict";
(function () {
  const log = document.getElementById("log");
  const live = document.getElementById("live");
  const follow = document.getElementById("follow");
  let count = 0;

  const source = new EventSource(log.dataset.stream);
  source.addEventListener("open", function () { live.textContent = "live"; });
  source.addEventListener("lines", function (e) {
    const text = JSON.parse(e.data).map(function (l) { return "[" + l[0] + "] " + l[1] + "\n"; }).join("");
    log.appendChild(document.createTextNode(text));
    count += JSON.parse(e.data).length;
    log.dataset.lines = String(count);
    if (follow.checked) log.scrollTop = log.scrollHeight;
  });
  source.addEventListener("end", function (e) {
    source.close();
    const state = document.getElementById("state");
    state.textContent = JSON.parse(e.data).state;
    state.className = "state state-" + state.textContent.toLowerCase();
    live.textContent = "ended";
    log.dataset.ended = "true";
  });
  source.addEventListener("signed-out", function () {
    source.close();
    live.textContent = "signed out: ask `cantata dashboard` for a new link";
  });
  source.addEventListener("error", function () {
    if (source.readyState !== EventSource.CLOSED) live.textContent = "reconnecting…";
  });
})();
