// Runs the dashboard's app.js (argv[2]) against a fake DOM, fetch and
// clock, drives it through views and events, and prints what it asked
// the API for, as JSON, for dashboard_test.go.
"use strict";
const fs = require("fs");
const vm = require("vm");

class Node {
  constructor(tag, text) {
    this.tag = tag; this.text = text || ""; this.kids = [];
    this.dataset = {}; this.style = {}; this.attrs = {}; this.className = "";
    this.classList = {toggle() {}};
  }
  setAttribute(k, v) { this.attrs[k] = v; }
  addEventListener() {}
  append(...c) { this.kids.push(...c); }
  replaceChildren(...c) { this.kids = c; }
  set textContent(t) { this.kids = []; this.text = t; }
  get textContent() { return this.text + this.kids.map((k) => k.textContent).join(""); }
}
const byID = {};
const document = {
  getElementById(id) { return (byID[id] = byID[id] || new Node("div")); },
  createElement(tag) { return new Node(tag); },
  createElementNS(_, tag) { return new Node(tag); },
  createTextNode(t) { return new Node("#text", t); },
  querySelectorAll() { return []; },
};

// The clock: timers run only when the harness advances it.
let now = 0, timerID = 0;
const timers = new Map();
function setTimeout(f, ms) { const id = ++timerID; timers.set(id, {at: now + (ms || 0), f}); return id; }
function clearTimeout(id) { timers.delete(id); }
async function advance(ms) {
  const end = now + ms;
  await settle();
  for (;;) {
    let next = null;
    for (const [id, t] of timers) if (t.at <= end && (!next || t.at < next[1].at)) next = [id, t];
    if (!next) break;
    timers.delete(next[0]);
    now = next[1].at;
    next[1].f();
    await settle();
  }
  now = end;
  await settle();
}
function settle() {
  return new Promise((r) => {
    let n = 0;
    const turn = () => (++n < 20 ? setImmediate(turn) : r());
    setImmediate(turn);
  });
}

// fetch: API reads answer canned data; /events is a stream the harness
// writes to.
const calls = [];
let stream = null;
const canned = {
  "/overview": {jobs: {}, jobs_total: 0, agents: 0, agent_levels: {}, queue_depth: 0, dead_letters: 1234, time: ""},
  "/failovers": [], "/healing/actions": [], "/agents": [], "/queues/dead-letters": [{id: 7, job_id: "j", step_id: "a", reason: "poison"}],
  "/queues/tasks": {tasks: [], tasks_total: 0, dead_letters: 1234}, "/healing/status": {agents: [], by_level: {}},
  "/jobs": {jobs: [], matched: 0},
};
function fetch(url, opts) {
  calls.push(url);
  const path = url.replace(/^\/api\/v1/, "").replace(/\?.*$/, "");
  if (path === "/events") {
    const queue = [], waiting = [];
    const s = {url, aborted: false, push(chunk) {
      const v = {value: new TextEncoder().encode(chunk), done: false};
      if (waiting.length) waiting.shift().resolve(v); else queue.push(v);
    }};
    if (opts && opts.signal) opts.signal.addEventListener("abort", () => {
      s.aborted = true;
      for (const w of waiting.splice(0)) w.reject(new Error("AbortError"));
    });
    stream = s;
    return Promise.resolve({ok: true, status: 200, body: {getReader: () => ({
      read: () => (queue.length ? Promise.resolve(queue.shift())
        : s.aborted ? Promise.reject(new Error("AbortError")) : new Promise((resolve, reject) => waiting.push({resolve, reject}))),
    })}});
  }
  let data = canned[path];
  if (data === undefined && path.startsWith("/jobs/")) {
    const id = decodeURIComponent(path.slice(6));
    data = {job: {id, name: id, state: "running", desired: "succeeded", spec: {steps: []}}, steps: []};
  }
  return Promise.resolve({ok: true, status: 200, text: () => Promise.resolve(JSON.stringify(data === undefined ? null : data))});
}

const listeners = {};
const location = {hash: "#/overview"};
const sandbox = {
  document, location, fetch, setTimeout, clearTimeout, console, TextDecoder, TextEncoder, AbortController, Node, URLSearchParams,
  localStorage: {getItem: () => null, setItem() {}}, prompt: () => null, confirm: () => true,
  window: {addEventListener(type, f) { (listeners[type] = listeners[type] || []).push(f); }},
};
sandbox.globalThis = sandbox;
vm.createContext(sandbox);

const event = (type, data) => stream.push(`event: ${type}\ndata: ${JSON.stringify(data)}\n\n`);
const count = (prefix) => calls.filter((u) => u.startsWith("/api/v1" + prefix)).length;
const typesOf = (s) => (new URL("http://x" + s.url).searchParams.get("types") || "").split(",").filter(Boolean).sort().join(",");
async function go(hash) {
  location.hash = hash;
  for (const f of listeners.hashchange || []) f();
  await settle();
}

(async () => {
  const out = {};
  vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), sandbox, {filename: "app.js"});
  await settle();

  // Overview: a job event every 500 ms for 10 s.
  const first = stream;
  out.overviewTypes = typesOf(first);
  const before = count("/overview");
  for (let i = 0; i < 20; i++) {
    event("job", {id: "j" + i, state: "running"});
    await advance(500);
  }
  await advance(5000);
  out.overviewReloads = count("/overview") - before;

  // The job view of j1: events of another job change nothing; one of its
  // steps re-reads it once.
  await go("#/jobs/j1");
  out.streamEndedOnViewChange = first.aborted;
  out.jobTypes = typesOf(stream);
  const shown = count("/jobs/j1");
  for (let i = 0; i < 10; i++) {
    event("step", {job_id: "j2", step_id: "a", state: "running"});
    event("job", {id: "j2", state: "running"});
    await advance(500);
  }
  await advance(5000);
  out.jobReloadsForOtherJobs = count("/jobs/j1") - shown;
  event("step", {job_id: "j1", step_id: "a", state: "succeeded"});
  event("job", {id: "j1", state: "succeeded"});
  await advance(5000);
  out.jobReloadsForItsJob = count("/jobs/j1") - shown;

  // Dead letters: a bounded page, and the stream's count.
  await go("#/dlq");
  out.dlqTypes = typesOf(stream);
  out.dlqList = calls.filter((u) => u.startsWith("/api/v1/queues/dead-letters")).pop();
  out.dlqText = document.getElementById("main").textContent;
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
