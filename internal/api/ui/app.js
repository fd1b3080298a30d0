// Warden dashboard: plain JavaScript, no build step. It reads /api/v1 and
// follows /api/v1/events (server-sent events, read with fetch so that a
// bearer token can be sent) to stay live.
"use strict";

const API = "/api/v1";
const main = document.getElementById("main");
let token = localStorage.getItem("warden-token") || "";
let view = null; // {name, arg, refresh}
let refreshTimer = null;

// h builds an element: h("td", {class: "x", onclick: f}, "text", child...).
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of kids.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
function svg(tag, attrs, ...kids) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v); else el.setAttribute(k, v);
  }
  for (const c of kids.flat()) if (c != null) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

async function api(method, path, body) {
  const headers = {};
  if (token) headers.Authorization = "Bearer " + token;
  const res = await fetch(API + path, {method, headers, body});
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = text; }
  if (!res.ok) {
    const e = (data && data.error) || {code: "http_" + res.status, message: text};
    const err = new Error(e.code + ": " + e.message);
    err.code = e.code;
    throw err;
  }
  return data;
}

function toast(msg, bad) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = "show" + (bad ? " err" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, 4000);
}

const state = (s) => h("span", {class: "state s-" + (s || "unknown")}, s || "unknown");
const ago = (t) => {
  if (!t) return "";
  const d = (Date.now() - new Date(t).getTime()) / 1000;
  if (d < 1) return "now";
  if (d < 60) return Math.round(d) + "s ago";
  if (d < 3600) return Math.round(d / 60) + "m ago";
  if (d < 172800) return Math.round(d / 3600) + "h ago";
  return Math.round(d / 86400) + "d ago";
};
const when = (t) => t ? new Date(t).toLocaleString() : "";
function table(headers, rows, empty) {
  if (!rows.length) return h("p", {class: "muted"}, empty || "Nothing here.");
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))), h("tbody", {}, rows));
}
function bar(frac) {
  const s = h("span");
  s.style.width = Math.max(0, Math.min(1, frac)) * 100 + "%";
  return h("div", {class: "bar", title: Math.round(frac * 100) + "%"}, s);
}

// ---- views -----------------------------------------------------------

// jobStates are the job states, in lifecycle order (internal/jobstore).
const jobStates = ["pending", "running", "succeeded", "failed", "cancelled", "expired",
  "compensating", "compensated", "compensation_failed"];

async function overview() {
  const [ov, failovers, healing] = await Promise.all([
    api("GET", "/overview"), api("GET", "/failovers?limit=5"), api("GET", "/healing/actions?limit=5")]);
  const card = (n, l, id) => h("div", {class: "card", id}, h("div", {class: "n"}, n), h("div", {class: "l"}, l));
  // Every job state (internal/jobstore JobStates): the cards add up to
  // jobs_total.
  const states = jobStates;
  return [
    h("h2", {}, "Overview"),
    h("div", {class: "cards"},
      card(ov.jobs_total, "jobs stored", "ov-jobs"),
      states.map((s) => card(ov.jobs[s] || 0, s)),
      card(ov.agents, "agents present", "ov-agents"),
      card(ov.queue_depth, "tasks queued", "ov-queue"),
      card(ov.dead_letters, "dead letters", "ov-dlq")),
    h("h3", {}, "Agents by health"),
    h("div", {class: "cards"}, Object.entries(ov.agent_levels).map(([l, n]) => card(n, l))),
    h("div", {class: "split"},
      h("div", {}, h("h3", {}, "Recent failovers"), eventsTable(failovers.slice().reverse())),
      h("div", {}, h("h3", {}, "Recent healing actions"), eventsTable(healing.slice().reverse()))),
  ];
}

function eventsTable(evs) {
  return table(["time", "agent", "what", "reason"], evs.map((e) =>
    h("tr", {}, h("td", {title: when(e.time)}, ago(e.time)), h("td", {}, e.agent || ""),
      h("td", {}, (e.data && (e.data.action || e.data.outcome)) || e.kind),
      h("td", {}, e.reason || ""))), "None yet.");
}

let jobsFilter = {state: "", cursor: "", stack: []};
async function jobs() {
  const q = new URLSearchParams({limit: "50"});
  if (jobsFilter.state) q.set("state", jobsFilter.state);
  if (jobsFilter.cursor) q.set("cursor", jobsFilter.cursor);
  const page = await api("GET", "/jobs?" + q);
  const sel = h("select", {id: "job-state", onchange: (e) => { jobsFilter = {state: e.target.value, cursor: "", stack: []}; render(); }},
    ["", ...jobStates].map((s) =>
      h("option", {value: s, selected: s === jobsFilter.state}, s || "all states")));
  const rows = page.jobs.map((j) => h("tr", {class: "click", dataset: {job: j.id}, onclick: () => go("#/jobs/" + j.id)},
    h("td", {class: "mono"}, j.id), h("td", {}, j.name), h("td", {}, state(j.state)),
    h("td", {}, j.steps_done + "/" + j.steps_total), h("td", {title: when(j.created_at)}, ago(j.created_at)),
    h("td", {class: "muted"}, j.error || "")));
  return [
    h("h2", {}, "Jobs"),
    h("div", {class: "toolbar"}, sel,
      h("span", {class: "muted"}, `${page.jobs.length} of ${page.matched} matching`),
      jobsFilter.stack.length ? h("button", {onclick: () => { jobsFilter.cursor = jobsFilter.stack.pop(); render(); }}, "← newer") : null,
      page.next ? h("button", {onclick: () => { jobsFilter.stack.push(jobsFilter.cursor); jobsFilter.cursor = page.next; render(); }}, "older →") : null),
    table(["id", "name", "state", "steps", "created", "error"], rows, "No jobs."),
  ];
}

let selectedStep = null;
async function job(id) {
  const d = await api("GET", "/jobs/" + encodeURIComponent(id));
  const j = d.job, steps = d.steps || [];
  const byID = Object.fromEntries(steps.map((s) => [s.id, s]));
  if (!selectedStep || !byID[selectedStep]) {
    const bad = steps.find((s) => s.state === "failed" || s.state === "dead_lettered" || (s.attempts || []).length > 1);
    selectedStep = (bad || steps[0] || {}).id;
  }
  const actions = h("div", {class: "toolbar"},
    h("button", {id: "job-cancel", class: "danger", onclick: () => act("POST", `/jobs/${id}/cancel`, "cancel requested")}, "Cancel"),
    h("button", {id: "job-retry", onclick: () => act("POST", `/jobs/${id}/retry`, "failed steps reopened")}, "Retry failed steps"),
    h("a", {href: "#/jobs"}, "← all jobs"));
  const sel = byID[selectedStep];
  return [
    h("h2", {}, "Job ", h("span", {class: "mono"}, j.id), " ", state(j.state)),
    h("p", {class: "muted"}, `${j.name} · created ${when(j.created_at)}` + (j.finished_at ? ` · finished ${when(j.finished_at)}` : "") +
      (j.desired !== "succeeded" && !j.timed_out ? ` · desired ${j.desired}` : "") +
      (j.deadline && (j.timed_out || (!j.finished_at && j.state !== "compensating" && j.desired !== "cancelled")) ? (j.timed_out ? ` · timed out ${when(j.deadline)}` : ` · timeout ${j.spec.timeout}, runs out ${when(j.deadline)}`) : "")),
    j.error ? h("p", {class: "err"}, j.error) : null,
    actions,
    h("h3", {}, "Steps"),
    dag(j, steps),
    table(["step", "action", "state", "attempt", "agent", "depends on", "error / waiting"], steps.map((s) =>
      h("tr", {class: "click" + (s.id === selectedStep ? " sel" : ""), dataset: {step: s.id}, onclick: () => { selectedStep = s.id; render(); }},
        h("td", {class: "mono"}, s.id), h("td", {}, s.action), h("td", {}, state(s.state)),
        h("td", {}, `${s.attempt} (${(s.attempts || []).length} reported)`), h("td", {}, s.actor || ""),
        h("td", {}, (s.depends_on || []).join(", ")), h("td", {class: "muted"}, s.state === "pending" && s.waiting ? "waiting: " + s.waiting : s.last_error || ""))),
      "No step materialised yet."),
    sel ? stepDetail(sel) : null,
  ];
}

// dag draws the steps by depth (longest chain of dependencies), edges from
// each dependency to its dependent.
function dag(j, steps) {
  const spec = (j.spec && j.spec.steps) || steps;
  const deps = Object.fromEntries(spec.map((s) => [s.id, s.depends_on || []]));
  const depth = {};
  const d = (id, seen = new Set()) => {
    if (depth[id] !== undefined) return depth[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    depth[id] = Math.max(0, ...(deps[id] || []).map((p) => d(p, seen) + 1));
    return depth[id];
  };
  spec.forEach((s) => d(s.id));
  const cols = [];
  spec.forEach((s) => { (cols[depth[s.id]] = cols[depth[s.id]] || []).push(s.id); });
  const W = 150, H = 46, GX = 60, GY = 16;
  const pos = {};
  cols.forEach((ids, c) => ids.forEach((id, r) => { pos[id] = {x: 10 + c * (W + GX), y: 10 + r * (H + GY)}; }));
  const width = 20 + cols.length * (W + GX), height = 20 + Math.max(1, ...cols.map((c) => c.length)) * (H + GY);
  const byID = Object.fromEntries(steps.map((s) => [s.id, s]));
  const edges = [];
  for (const [id, ps] of Object.entries(deps)) for (const p of ps) {
    if (!pos[p] || !pos[id]) continue;
    const a = pos[p], b = pos[id];
    edges.push(svg("path", {class: "edge", d: `M${a.x + W},${a.y + H / 2} C${a.x + W + GX / 2},${a.y + H / 2} ${b.x - GX / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}`}));
  }
  const nodes = spec.map((s) => {
    const st = byID[s.id] || {state: "pending", attempts: []};
    const p = pos[s.id];
    const n = (st.attempts || []).length;
    return svg("g", {class: "node" + (s.id === selectedStep ? " sel" : ""), "data-step": s.id, transform: `translate(${p.x},${p.y})`,
      onclick: () => { selectedStep = s.id; render(); }},
      svg("rect", {width: W, height: H}),
      svg("text", {x: 10, y: 18}, s.id + (s.action ? " · " + s.action : "")),
      svg("text", {x: 10, y: 36, class: "st s-" + st.state}, st.state + (n > 1 ? ` · ${n} attempts` : "")));
  });
  return h("div", {class: "graph"}, svg("svg", {width, height, role: "img", "aria-label": "step graph"}, edges, nodes));
}

function stepDetail(s) {
  const chain = (s.attempts || []).map((a, i) => [
    i ? h("span", {class: "arrow"}, "→") : null,
    h("div", {class: "attempt", dataset: {attempt: i + 1}},
      h("div", {class: "h"}, `#${i + 1} `, state(a.status)),
      h("div", {class: "muted"}, `epoch ${a.epoch} on ${a.agent || "?"}`),
      a.started_at && a.finished_at ? h("div", {class: "muted"}, ((new Date(a.finished_at) - new Date(a.started_at)) / 1000).toFixed(3) + " s") : null,
      a.error ? h("div", {class: "err"}, a.error + (a.class ? ` [${a.class}]` : "")) : null),
  ]);
  return h("section", {id: "step-detail"},
    h("h3", {}, `Step ${s.id}: retry chain`),
    h("p", {}, state(s.state), ` attempt ${s.attempt} of ${s.max_retries + 1}, epoch ${s.epoch}`,
      s.actor ? `, agent ${s.actor}` : "", s.waiting ? ` · waiting: ${s.waiting}` : ""),
    s.last_error ? h("p", {class: "err"}, s.last_error) : null,
    chain.length ? h("div", {class: "chain", id: "retry-chain"}, chain.flat()) :
      h("p", {class: "muted"}, s.attempt > 0 || s.recoveries > 0
        ? `Dispatched ${s.attempt} time(s), taken back ${s.recoveries || 0} time(s); no attempt reported a result.`
        : "Not run yet."),
    s.output ? h("pre", {class: "mono"}, JSON.stringify(s.output)) : null);
}

async function agents() {
  const as = await api("GET", "/agents");
  const rows = as.map((a) => {
    const hl = a.health;
    return h("tr", {dataset: {agent: a.pool + "." + a.id}},
      h("td", {class: "mono"}, a.id), h("td", {}, a.pool),
      h("td", {}, state(hl ? hl.level : "unknown"), hl && hl.action ? h("div", {class: "muted"}, hl.action) : null),
      h("td", {}, hl ? hl.score.toFixed(2) : ""),
      h("td", {}, bar(a.load), h("span", {class: "muted"}, `${a.in_flight}/${a.max_concurrent}`)),
      h("td", {}, a.heartbeat_age_seconds.toFixed(1) + " s"),
      h("td", {}, `${a.succeeded} ok / ${a.failed} failed`),
      h("td", {}, a.draining ? "draining" : ""),
      h("td", {},
        h("button", {onclick: () => act("POST", `/agents/${a.pool}/${a.id}/${a.draining ? "undrain" : "drain"}`, a.draining ? "undrained" : "drained")}, a.draining ? "Undrain" : "Drain"), " ",
        h("button", {class: "danger", onclick: () => confirm(`Fail over ${a.id}? Its queued tasks move to other agents.`) && act("POST", `/agents/${a.pool}/${a.id}/failover`, "failover requested")}, "Fail over")));
  });
  return [h("h2", {}, "Agents"), table(["agent", "pool", "health", "score", "load", "heartbeat", "tasks", "", ""], rows, "No agent is present.")];
}

// The dead letters, a page of summaries at a time, oldest first: the next
// page starts after the last id shown. The count is the stream's, not the
// page's.
const DLQ_PAGE = 100;
let dlqPage = {after: 0, stack: []};
async function dlq() {
  const [ls, q] = await Promise.all([
    api("GET", `/queues/dead-letters?limit=${DLQ_PAGE}&after=${dlqPage.after}`), api("GET", "/queues/tasks")]);
  const stored = q.dead_letters;
  const rows = ls.map((l) => h("tr", {dataset: {letter: l.id}},
    h("td", {class: "mono"}, l.id),
    h("td", {}, h("a", {href: "#/jobs/" + l.job_id, class: "mono"}, l.job_id), " / ", h("span", {class: "mono"}, l.step_id)),
    h("td", {}, l.reason), h("td", {}, l.deliveries), h("td", {title: when(l.time)}, ago(l.time)),
    h("td", {class: "muted"}, l.detail, l.last_error ? h("div", {class: "err"}, l.last_error) : null),
    h("td", {}, h("button", {class: "retry", onclick: () => act("POST", `/queues/dead-letters/${l.id}/retry`, `dead letter ${l.id} retried`)}, "Retry"))));
  return [
    h("h2", {}, "Dead letters"),
    h("div", {class: "toolbar"},
      h("span", {class: "muted", id: "dlq-count"}, `${stored} stored` + (ls.length && ls.length < stored ? `, ids ${ls[0].id}–${ls[ls.length - 1].id} shown` : "")),
      dlqPage.stack.length ? h("button", {onclick: () => { dlqPage.after = dlqPage.stack.pop(); render(); }}, "← older") : null,
      ls.length === DLQ_PAGE ? h("button", {onclick: () => { dlqPage.stack.push(dlqPage.after); dlqPage.after = ls[ls.length - 1].id; render(); }}, "newer →") : null,
      stored ? h("button", {class: "danger", onclick: () => confirm("Delete every dead letter for good?") && act("DELETE", "/queues/dead-letters?confirm=yes", "purged")}, "Purge all") : null),
    table(["id", "job / step", "reason", "deliveries", "when", "detail", ""], rows, "No dead letters."),
  ];
}

async function history() {
  const [fo, heal, status] = await Promise.all([api("GET", "/failovers?limit=100"), api("GET", "/healing/actions?limit=100"), api("GET", "/healing/status")]);
  const foRows = fo.slice().reverse().map((e) => h("tr", {},
    h("td", {title: when(e.time)}, ago(e.time)), h("td", {}, e.agent), h("td", {}, (e.data || {}).outcome || ""),
    h("td", {}, (e.data || {}).tasks_moved || ""), h("td", {}, (e.data || {}).duration || ""), h("td", {class: "muted"}, e.reason || "")));
  return [
    h("h2", {}, "Failovers and self-healing"),
    h("div", {class: "cards"}, Object.entries(status.by_level).map(([l, n]) =>
      h("div", {class: "card"}, h("div", {class: "n"}, n), h("div", {class: "l"}, l + " agents")))),
    h("h3", {}, "Failovers"),
    table(["when", "agent", "outcome", "tasks moved", "took", "why"], foRows, "No failover yet."),
    h("h3", {}, "Healing actions"),
    eventsTable(heal.slice().reverse()),
  ];
}

async function act(method, path, done) {
  try {
    await api(method, path);
    toast(done);
    render();
  } catch (e) {
    toast(e.message, true);
  }
}

// ---- routing and live updates -----------------------------------------

const views = {overview, jobs, job, agents, dlq, history};
function route() {
  const [, name = "overview", arg] = (location.hash || "#/overview").split("/");
  return {name: name === "jobs" && arg ? "job" : name, arg: arg && decodeURIComponent(arg)};
}
function go(hash) { location.hash = hash; }
let rendering = false, again = false;
async function render() {
  if (rendering) { again = true; return; }
  rendering = true;
  const r = route();
  const f = views[r.name] || overview;
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === (r.name === "job" ? "jobs" : r.name)));
  try {
    const nodes = await f(r.arg);
    main.replaceChildren(...[nodes].flat().filter(Boolean));
    main.dataset.view = r.name;
  } catch (e) {
    main.replaceChildren(h("h2", {}, "Could not load"), h("p", {class: "err"}, e.message),
      e.code === "unauthenticated" || e.code === "forbidden" ? h("p", {}, "Set a token with the Token button.") : null);
  }
  rendering = false;
  if (again) { again = false; render(); }
}
// Live updates: each view follows only the event types that change what
// it shows (?types=), and re-reads itself at most once per `every` ms
// however many events come; the job view only for events of its job.
// Every re-read costs the server reads (the overview scans every job
// record), and every open tab does it.
const liveViews = {
  overview: {types: "job,agent,event", every: 5000},
  jobs: {types: "job", every: 3000},
  job: {types: "job,step", every: 2000},
  agents: {types: "agent,event", every: 3000},
  dlq: {types: "event", every: 3000},
  history: {types: "event", every: 3000},
};
const liveFor = (r) => liveViews[r.name] || liveViews.overview;
// changes reports whether an event of type with data changes view r.
function changes(r, type, data) {
  if (r.name !== "job") return true;
  return (type === "job" && data && data.id === r.arg) || (type === "step" && data && data.job_id === r.arg);
}
function soon() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; render(); }, liveFor(route()).every);
}

// following is the event stream being read: its types, and how to end it
// when the view changes to one that follows other types.
let following = null;
function refollow() {
  if (following && following.types !== liveFor(route()).types) following.ctl.abort();
}

async function follow() {
  const live = document.getElementById("live");
  for (;;) {
    const ctl = new AbortController();
    following = {types: liveFor(route()).types, ctl};
    try {
      const headers = token ? {Authorization: "Bearer " + token} : {};
      const res = await fetch(API + "/events?types=" + following.types, {headers, signal: ctl.signal});
      if (!res.ok) throw new Error("events: " + res.status);
      live.textContent = "live"; live.className = "pill on";
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          const type = /^event: (.*)$/m.exec(block);
          if (!type) continue;
          const line = /^data: (.*)$/m.exec(block);
          let data = null;
          try { data = line && JSON.parse(line[1]); } catch (_) { /* not JSON: no data */ }
          if (changes(route(), type[1], data)) soon();
        }
      }
    } catch (_) { /* reconnect below */ }
    // A view that follows other types: its stream now (it rendered itself).
    if (ctl.signal.aborted) continue;
    live.textContent = "reconnecting…"; live.className = "pill";
    await new Promise((r) => setTimeout(r, 2000));
    render(); // what changed while away
  }
}

document.getElementById("token-btn").addEventListener("click", () => {
  const t = prompt("Bearer token for the Warden API (empty: none)", token);
  if (t === null) return;
  token = t.trim();
  localStorage.setItem("warden-token", token);
  render();
});
window.addEventListener("hashchange", () => {
  selectedStep = null;
  if (route().name !== "dlq") dlqPage = {after: 0, stack: []};
  clearTimeout(refreshTimer); refreshTimer = null; // rendered now
  refollow();
  render();
});
render();
follow();
