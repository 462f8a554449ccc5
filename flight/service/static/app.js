// The live view: polls the JSON API every second and renders it. Every text from the API goes into
// the page as text (textContent), never as HTML: SQL and error messages are the users' words.
"use strict";

const view = document.getElementById("view");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") node.addEventListener("click", v); else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function table(headers, rows) {
  return el("table", {}, el("tr", {}, ...headers.map(h => el("th", {}, h))), ...rows);
}

async function json(path, options) {
  const response = await fetch(path, options);
  return response.json();
}

function queryRow(q, cancellable) {
  const link = el("a", { href: "#/query/" + q.id }, q.id);
  const cells = [el("td", {}, link), el("td", { class: "state-" + q.state }, q.state), el("td", {}, q.user),
    el("td", { class: "sql" }, q.sql), el("td", {}, q.seconds.toFixed(1) + " s"), el("td", { class: "error" }, q.error || "")];
  cells.push(el("td", {}, cancellable ? el("button", { class: "cancel", "data-query": q.id, onclick: () => cancel(q.id) }, "Cancel") : ""));
  return el("tr", { "data-query": q.id }, ...cells);
}

async function cancel(id) {
  await json("/api/queries/" + id + "/cancel", { method: "POST" });
  render();
}

async function queriesPage() {
  const data = await json("/api/queries");
  const headers = ["query", "state", "user", "SQL", "time", "error", ""];
  const queued = Object.entries(data.queued).map(([user, n]) => user + ": " + n).join(", ") || "none";
  return [el("h2", {}, "Running"), table(headers, data.running.map(q => queryRow(q, true))),
    el("p", {}, "Waiting for a slot: " + queued),
    el("h2", {}, "Ended"), table(headers, data.ended.map(q => queryRow(q, false)))];
}

function bytes(n) {
  n = Number(n || 0);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function seconds(t) {
  return t === null || t === undefined ? "" : Number(t).toFixed(2) + " s";
}

function stageBox(s) {
  const percent = s.tasks.length ? Math.round(100 * s.done / s.tasks.length) : 0;
  const target = s.consumers.length ? "→ stage " + s.consumers.join(", ") + " (" + s.output + ")" : "head";
  const rows = s.tasks.map(t => el("tr", {}, el("td", {}, t.worker), el("td", { class: "state-" + t.state }, t.state),
    el("td", {}, t.rows), el("td", {}, bytes(t.bytes)), el("td", {}, bytes(t.spilled)), el("td", {}, t.seconds + " s")));
  return el("div", { class: "stage", "data-stage": s.id },
    el("h3", {}, "Stage " + s.id + " " + target),
    el("div", { class: "bar" }, el("div", { style: "width:" + percent + "%" })),
    el("div", { class: "progress" }, s.done + "/" + s.tasks.length + " tasks done"),
    table(["worker", "state", "rows", "bytes", "spilled", "time"], rows));
}

// Each stage's time line on one axis, from the query's start: a bar from its first task's open to its
// last task's output (to now while one runs), with a mark at each task's admission.
function timeline(stages, elapsed) {
  const span = Math.max(elapsed, ...stages.map(s => s.end || 0), 0.001);
  const pct = t => (100 * t / span).toFixed(2) + "%";
  const rows = stages.map(s => {
    const start = s.start ?? 0, end = s.end ?? elapsed;
    const marks = s.tasks.filter(t => t.ready !== null).map(t => el("span", { class: "mark", style: "left:" + pct(t.ready) }));
    const bar = el("div", { class: "span" + (s.end === null ? " open" : ""), style: "left:" + pct(start) + ";width:" + pct(Math.max(end - start, 0)) });
    return el("tr", { "data-timeline": s.id }, el("td", {}, "Stage " + s.id),
      el("td", { class: "lane" }, el("div", { class: "track" }, bar, ...marks)),
      el("td", {}, seconds(s.start) + " – " + (s.end === null ? "running" : seconds(s.end))));
  });
  return table(["stage", "time line (0 – " + span.toFixed(2) + " s)", "from – to"], rows);
}

function feedRows(feeds) {
  return feeds.map(f => el("tr", { "data-feed": f.feed }, el("td", {}, f.feed), el("td", {}, f.discovered + (f.discovery_ended ? "" : "…")),
    el("td", {}, f.sent), el("td", {}, f.taken), el("td", {}, f.waiting), el("td", {}, seconds(f.lag_seconds))));
}

async function queryPage(id) {
  const q = await json("/api/queries/" + id);
  if (q.error && !q.id) return [el("p", { class: "error" }, q.error)];
  const header = table(["query", "state", "user", "SQL", "time", "error", ""], [queryRow(q, q.state === "running")]);
  const out = [el("h2", {}, "Query " + q.id), header, el("h2", {}, "Stages"), el("div", { class: "graph" }, ...q.stages.map(stageBox)),
    el("h2", {}, "Time line"), timeline(q.stages, q.seconds)];
  if (q.feeds.length) {
    out.push(el("h2", {}, "Work-unit feeds"),
      table(["feed", "discovered", "sent", "taken", "not yet sent", "lag (oldest unsent)"], feedRows(q.feeds)));
  }
  return out;
}

async function workersPage() {
  const data = await json("/api/workers");
  const rows = data.workers.map(w => {
    const load = w.load || {};
    return el("tr", { "data-worker": w.url }, el("td", {}, w.url), el("td", {}, w.running_tasks ?? 0),
      el("td", {}, (load.source_threads ?? 0) + " / " + (load.source_threads_max ?? "?")),
      el("td", {}, bytes(load.reserved_bytes) + " / " + bytes(load.memory_budget)),
      el("td", {}, bytes(w.buffered_bytes)), el("td", {}, load.queued_tasks ?? 0),
      el("td", {}, w.draining ? "draining" : (w.error ? "" : "serving")), el("td", { class: "error" }, w.error || ""));
  });
  const headers = ["worker", "running tasks", "source threads", "memory reserved / budget", "buffered", "queued tasks", "state", "error"];
  return [el("h2", {}, "Workers"), table(headers, rows)];
}

async function render() {
  const hash = location.hash || "#/";
  let content;
  try {
    if (hash.startsWith("#/query/")) content = await queryPage(hash.slice(8));
    else if (hash === "#/workers") content = await workersPage();
    else content = await queriesPage();
  } catch (e) {
    content = [el("p", { class: "error" }, "The service did not answer: " + e)];
  }
  view.replaceChildren(...content);
}

window.addEventListener("hashchange", render);
render();
setInterval(render, 1000);
