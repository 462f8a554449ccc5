// The live view: polls the JSON API every second and renders it. Every text from the API goes into
// the page as text (textContent), never as HTML: SQL and error messages are the users' words.
"use strict";

const view = document.getElementById("view");
const whoami = document.getElementById("whoami");
const SVG = "http://www.w3.org/2000/svg";
const state = { me: null, expanded: new Set(), stateFilter: "all", userFilter: "all", explained: new Map() };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") node.addEventListener("click", v);
    else if (k === "onchange") node.addEventListener("change", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function table(headers, rows, attrs) {
  return el("table", attrs || {}, el("tr", {}, ...headers.map(h => el("th", {}, h))), ...rows);
}

class LoggedOut extends Error {}

async function json(path, options) {
  const response = await fetch(path, options);
  if (response.status === 401) throw new LoggedOut();
  return response.json();
}

function bytes(n) {
  n = Number(n || 0);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

const count = n => Number(n || 0).toLocaleString("en-US");
const seconds = t => (t === null || t === undefined ? "" : Number(t).toFixed(2) + " s");
const clock = t => new Date(t * 1000).toLocaleTimeString("en-GB");
const mayCancel = q => q.state === "running" && state.me && (state.me.operator || state.me.user === q.user);

// ------------------------------------------------------------------ queries: one line each

function queryRows(q) {
  const open = state.expanded.has(q.id);
  const toggle = () => { open ? state.expanded.delete(q.id) : state.expanded.add(q.id); render(); };
  const sql = el("td", { class: "sql-line", title: "click to show the whole statement", onclick: toggle }, (open ? "▾ " : "▸ ") + q.first_line);
  const cancel = mayCancel(q) ? el("button", { class: "cancel", "data-query": q.id, onclick: () => cancelQuery(q.id) }, "Cancel") : "";
  const rows = [el("tr", { "data-query": q.id },
    el("td", {}, el("a", { href: "#/query/" + q.id }, q.id)), el("td", { class: "state-" + q.state }, q.state), el("td", {}, q.user),
    el("td", {}, clock(q.started_at)), el("td", { class: "num" }, q.seconds.toFixed(2) + " s"), el("td", { class: "num" }, count(q.rows)),
    sql, el("td", {}, cancel))];
  if (open) {
    rows.push(el("tr", { class: "expanded", "data-sql-of": q.id }, el("td", { colspan: 8 },
      el("pre", { class: "sql" }, q.sql), q.error ? el("p", { class: "error" }, q.error) : "")));
  }
  return rows;
}

async function cancelQuery(id) {
  const answer = await json("/api/queries/" + id + "/cancel", { method: "POST" });
  if (answer.error) alert(answer.error);
  render();
}

function filters(users) {
  const select = (name, value, options, set) => el("label", {}, name + " ",
    el("select", { "data-filter": name, onchange: e => { set(e.target.value); render(); } },
      ...options.map(o => { const opt = el("option", { value: o }, o); if (o === value) opt.selected = true; return opt; })));
  return el("div", { class: "filters" },
    select("state", state.stateFilter, ["all", "running", "finished", "failed", "cancelled"], v => { state.stateFilter = v; }),
    select("user", state.userFilter, ["all", ...users], v => { state.userFilter = v; }));
}

async function queriesPage() {
  const data = await json("/api/queries");
  const all = [...data.running, ...data.ended];
  const users = [...new Set(all.map(q => q.user))].sort();
  const shown = all.filter(q => (state.stateFilter === "all" || q.state === state.stateFilter) &&
    (state.userFilter === "all" || q.user === state.userFilter));
  const queued = Object.entries(data.queued).map(([user, n]) => user + ": " + n).join(", ") || "none";
  const headers = ["query", "state", "user", "started", "time", "rows", "SQL (click for all of it)", ""];
  return [el("h2", {}, "Queries"), filters(users), el("p", {}, "Waiting for a slot: " + queued),
    table(headers, shown.flatMap(queryRows), { class: "queries" })];
}

// ------------------------------------------------------------------ one query: the stage graph

// Rows flow down: leaves at the top, the head at the bottom (a layer by distance from the head); in a layer, by id.
function layout(stages) {
  const byId = new Map(stages.map(s => [s.id, s]));
  const depth = new Map();
  const depthOf = s => {
    if (!depth.has(s.id)) depth.set(s.id, s.consumers.length ? 1 + Math.max(...s.consumers.map(c => depthOf(byId.get(c)))) : 0);
    return depth.get(s.id);
  };
  stages.forEach(depthOf);
  const deepest = Math.max(0, ...depth.values());
  const W = 230, H = 84, GX = 40, GY = 64, where = new Map(), filled = new Map();
  for (const s of [...stages].sort((a, b) => a.id - b.id)) {
    const layer = deepest - depth.get(s.id), col = filled.get(layer) || 0;
    filled.set(layer, col + 1);
    where.set(s.id, { x: 10 + col * (W + GX), y: 10 + layer * (H + GY) });
  }
  const cols = Math.max(1, ...filled.values());
  return { where, W, H, width: 20 + cols * W + (cols - 1) * GX, height: 20 + (deepest + 1) * H + deepest * GY };
}

function estimate(s) {
  return s.estimated_rows === null || s.estimated_rows === undefined ? "no estimate" : "est ~" + count(Math.round(s.estimated_rows));
}

function stageNode(s, at, W, H) {
  const status = s.tasks.some(t => t.state === "failed") ? "failed" : (s.end !== null ? "done" : "running");
  const kind = s.consumers.length ? s.output : "head";
  return svg("g", { class: "node " + status, "data-stage": s.id, "data-rows": s.rows, "data-bytes": s.bytes,
    "data-estimated-rows": s.estimated_rows ?? "", "data-tasks-done": s.done, "data-tasks": s.tasks.length,
    transform: `translate(${at.x},${at.y})` },
    svg("rect", { width: W, height: H, rx: 6 }),
    svg("text", { x: 10, y: 18, class: "title" }, `Stage ${s.id} · ${kind}`),
    svg("text", { x: 10, y: 37 }, `tasks ${s.done}/${s.tasks.length}`),
    svg("text", { x: 10, y: 55, class: "rows" }, `${count(s.rows)} rows · ${estimate(s)}`),
    svg("text", { x: 10, y: 73 }, `${bytes(s.bytes)} out` + (s.estimated_bytes ? ` · est ${bytes(s.estimated_bytes)}` : "")));
}

function stageGraph(stages) {
  const { where, W, H, width, height } = layout(stages);
  const edges = [], nodes = [];
  for (const s of stages) {
    const from = where.get(s.id);
    for (const c of s.consumers) {
      const to = where.get(c), x1 = from.x + W / 2, y1 = from.y + H, x2 = to.x + W / 2, y2 = to.y, my = (y1 + y2) / 2;
      edges.push(svg("g", { class: "edge " + s.output, "data-from": s.id, "data-to": c, "data-kind": s.output, "data-bytes": s.bytes },
        svg("path", { d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2 - 6}`, "marker-end": "url(#arrow)" }),
        svg("text", { x: x1 + 6, y: y1 + 16 }, `${s.output} · ${bytes(s.bytes)}`)));  // by its source: labels of one layer never meet
    }
    nodes.push(stageNode(s, from, W, H));
  }
  const arrow = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 2, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
    svg("path", { d: "M0,0 L10,5 L0,10 z" }));
  return svg("svg", { class: "stage-graph", width, height, viewBox: `0 0 ${width} ${height}` }, svg("defs", {}, arrow), ...edges, ...nodes);
}

function stageTables(stages) {
  return stages.map(s => el("details", { class: "stage", "data-stage": s.id },
    el("summary", {}, `Stage ${s.id}: ${s.done}/${s.tasks.length} tasks done`),
    table(["worker", "state", "rows", "bytes", "spilled", "time"], s.tasks.map(t => el("tr", {},
      el("td", {}, t.worker), el("td", { class: "state-" + t.state }, t.state), el("td", { class: "num" }, count(t.rows)),
      el("td", { class: "num" }, bytes(t.bytes)), el("td", { class: "num" }, bytes(t.spilled)), el("td", { class: "num" }, t.seconds + " s"))))));
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

async function explained(q) {
  const key = q.id + ":" + (q.state !== "running");
  if (!state.explained.has(key)) state.explained.set(key, json("/api/queries/" + q.id + "/explain"));
  const answer = await state.explained.get(key);
  return el("details", { class: "explain" }, el("summary", {}, answer.analyzed ? "explain(analyze=True)" : "explain()"),
    el("pre", {}, answer.text || answer.error || ""));
}

async function queryPage(id) {
  const q = await json("/api/queries/" + id);
  if (q.error && !q.id) return [el("p", { class: "error" }, q.error)];
  const headers = ["query", "state", "user", "started", "time", "rows", "SQL (click for all of it)", ""];
  const out = [el("h2", {}, "Query " + q.id), table(headers, queryRows(q), { class: "queries" })];
  if (q.decisions.length) out.push(el("h2", {}, "Planner decisions"), el("ul", { class: "decisions" }, ...q.decisions.map(d => el("li", {}, d))));
  out.push(el("h2", {}, "Stages"), el("div", { class: "graph" }, stageGraph(q.stages)),
    el("p", { class: "legend" }, "Workers: " + q.workers.map(w => w.label + " = " + w.url).join(", ")),
    ...stageTables(q.stages), el("h2", {}, "Time line"), timeline(q.stages, q.seconds));
  if (q.feeds.length) {
    out.push(el("h2", {}, "Work-unit feeds"),
      table(["feed", "discovered", "sent", "taken", "not yet sent", "lag (oldest unsent)"], feedRows(q.feeds)));
  }
  out.push(await explained(q));
  return out;
}

// ------------------------------------------------------------------ workers, login

async function workersPage() {
  const data = await json("/api/workers");
  const rows = data.workers.map(w => {
    const load = w.load || {};
    return el("tr", { "data-worker": w.url }, el("td", { title: w.url }, w.label), el("td", {}, w.url), el("td", {}, w.running_tasks ?? 0),
      el("td", {}, (load.source_threads ?? 0) + " / " + (load.source_threads_max ?? "?")),
      el("td", {}, bytes(load.reserved_bytes) + " / " + bytes(load.memory_budget)),
      el("td", {}, bytes(w.buffered_bytes)), el("td", {}, load.queued_tasks ?? 0),
      el("td", {}, w.draining ? "draining" : (w.error ? "" : "serving")), el("td", { class: "error" }, w.error || ""));
  });
  const headers = ["worker", "url", "running tasks", "source threads", "memory reserved / budget", "buffered", "queued tasks", "state", "error"];
  return [el("h2", {}, "Workers"), table(headers, rows)];
}

function loginPage() {
  const field = (name, type) => el("input", { name, type, autocomplete: name === "password" ? "current-password" : "off" });
  const user = field("user", "text"), password = field("password", "password"), token = field("token", "password");
  const message = el("p", { class: "error" });
  const submit = async e => {
    e.preventDefault();
    const body = token.value ? { token: token.value } : { user: user.value, password: password.value };
    const response = await fetch("/api/login", { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
    if (response.ok) { state.me = await response.json(); render(); } else message.textContent = (await response.json()).error;
  };
  const form = el("form", { class: "login" }, el("h2", {}, "Log in"),
    el("label", {}, "user ", user), el("label", {}, "password ", password), el("p", {}, "or"), el("label", {}, "token ", token),
    el("button", { type: "submit" }, "Log in"), message);
  form.addEventListener("submit", submit);
  return [form];
}

async function logOut() {
  await fetch("/api/logout", { method: "POST" });
  state.me = null;
  render();
}

function showMe() {
  if (!state.me || !state.me.login) { whoami.replaceChildren(); return; }
  whoami.replaceChildren(el("span", {}, state.me.user + (state.me.operator ? " (operator)" : "")), " ",
    el("button", { class: "logout", onclick: logOut }, "Log out"));
}

let rendering = false;

async function render() {
  if (rendering || document.querySelector("form.login input:focus")) return;  // never redraw a form being typed in
  rendering = true;
  const hash = location.hash || "#/";
  let content;
  try {
    if (!state.me) state.me = await json("/api/me");
    if (hash.startsWith("#/query/")) content = await queryPage(hash.slice(8));
    else if (hash === "#/workers") content = await workersPage();
    else content = await queriesPage();
  } catch (e) {
    if (e instanceof LoggedOut) { state.me = null; content = loginPage(); }
    else content = [el("p", { class: "error" }, "The service did not answer: " + e)];
  } finally {
    rendering = false;
  }
  showMe();
  const open = new Set([...view.querySelectorAll("details[open]")].map(d => d.className + ":" + (d.dataset.stage || "")));
  view.replaceChildren(...content);
  for (const d of view.querySelectorAll("details")) if (open.has(d.className + ":" + (d.dataset.stage || ""))) d.open = true;
}

window.addEventListener("hashchange", render);
render();
setInterval(() => { if (!document.querySelector("form.login")) render(); }, 1000);
