// peloton console: the cluster at a glance. Plain JavaScript (an ES module), no framework, no build
// step, no request to anything but the daemon that served it. The contract with the daemon (the
// JSON API, the server-sent events and the data-* hooks tests find) is docs/console-api.md.
//
// How it works: hash routes (#/cluster, #/pools, #/queue, #/jobs, #/jobs/<id>) pick a view; a view
// loads its JSON and draws it as HTML strings (one innerHTML per rack for the cluster's thousands
// of GPU cells, redrawn only where a rack changed); every click is handled by one delegated
// listener. The daemon's `changed` events name topics (and jobs): the page refetches only what the
// current view shows of those, at most one refresh in flight and one every REFRESH_MS. No inline
// script or style: colours are rules of a constructed style sheet, bars are SVG attributes, so a
// strict Content-Security-Policy (self only) holds.

const REFRESH_MS = 400; // at most one redraw per this, however many events come
const LOG_POLL_MS = 1000; // a task's log is followed by polling its next_offset this often
const LOG_CHUNK = 65536;
const LOG_KEEP = 1 << 20; // characters of log kept in the page (the start is dropped)
const TIMELINE_LANES = 48;
const EVENT_ROWS = 400;
const LEGEND_JOBS = 40;
const BIG_HOSTS = 48; // clusters up to this many hosts get large GPU cells
const JOB_STATES = ["PENDING", "RUNNING", "KILLING", "SUCCEEDED", "FAILED", "KILLED"];
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "KILLED", "LOST"]);

// ------------------------------------------------------------------------------------------ utils

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c],
  );
}

const enc = encodeURIComponent;
const pad = (n) => String(n).padStart(2, "0");

function fmtTime(t) {
  if (!t) return "—";
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmtClock(t) {
  if (!t) return "—";
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? String(t) : `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmtDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function ago(t) {
  if (!t) return "—";
  const ms = Date.now() - new Date(t).getTime();
  return Number.isNaN(ms) ? String(t) : `${fmtDuration(ms / 1000)} ago`;
}

function num(x, digits = 2) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return esc(x);
  if (!Number.isFinite(x)) return "∞";
  return Number.isInteger(x) ? String(x) : x.toFixed(digits).replace(/\.?0+$/, "");
}

function amount(kind, x) {
  if (x === null || x === undefined) return "—";
  if (/^(mem|disk)/.test(kind)) {
    return x >= 1024 ? `${num(x / 1024, 1)} GiB` : `${num(x, 0)} MiB`;
  }
  return num(x);
}

function pct(x) {
  return typeof x === "number" ? `${(x * 100).toFixed(x > 0 && x < 0.1 ? 1 : 0)}%` : "—";
}

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const shortId = (id) => String(id ?? "").slice(0, 8);

// A colour per job, derived from its id alone: the same job has the same colour on every page,
// in every browser, on every day. FNV-1a of the id picks the hue and a little of the lightness.
function jobColor(id) {
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) {
    h ^= id.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  // OKLCH: equal lightness looks equally light whatever the hue, so white ranks stay legible.
  const hue = h % 360;
  const light = [0.47, 0.53, 0.59][(h >>> 9) % 3];
  const chroma = [0.11, 0.14][(h >>> 13) % 2];
  return `oklch(${light} ${chroma} ${hue})`;
}

// The colour rules, one per job id seen, in a constructed style sheet (no inline style).
const colorSheet = new CSSStyleSheet();
document.adoptedStyleSheets = [...document.adoptedStyleSheets, colorSheet];
const colored = new Set();

function ensureColor(id) {
  if (!id || colored.has(id)) return;
  if (colored.size > 20000) {
    colorSheet.replaceSync("");
    colored.clear();
  }
  colored.add(id);
  colorSheet.insertRule(`[data-job="${CSS.escape(id)}"] { --c: ${jobColor(id)}; }`, colorSheet.cssRules.length);
}

function swatch(id, title = "") {
  ensureColor(id);
  return `<span class="sw" data-job="${esc(id)}"${title ? ` title="${esc(title)}"` : ""}></span>`;
}

// ------------------------------------------------------------------------------------------ API

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Relative URLs: the page works wherever the daemon's console is mounted (behind a proxy's path).
async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-Peloton-Console"] = "1";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
    });
  } catch (err) {
    throw new ApiError(0, `cannot reach the daemon (${err.message})`, "UNAVAILABLE");
  }
  const text = await resp.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      if (resp.ok) throw new ApiError(resp.status, `${path}: the daemon's answer is not JSON`, "INTERNAL");
    }
  }
  if (!resp.ok) {
    const message = data && data.error ? data.error : `${method} ${path}: HTTP ${resp.status} ${resp.statusText}`;
    throw new ApiError(resp.status, message, (data && data.code) || "");
  }
  return data;
}

// ------------------------------------------------------------------------------------------ state

const S = {
  session: null,
  route: { view: "cluster", id: null, params: new URLSearchParams() },
  view: null,
  gen: 0, // bumped by every navigation: answers for an older page are dropped
  data: {},
  updated: 0,
  hash: "",
  errorKind: null, // "load" (cleared by the next good load) or "action" (until dismissed)
  events: null,
  live: "connecting",
  selectedHost: null,
};

const main = () => $("#view");

function bump() {
  S.updated += 1;
  document.body.dataset.updated = String(S.updated);
}

function showError(message, kind = "load") {
  const banner = $("[data-error]");
  $("[data-error-text]", banner).textContent = message;
  banner.hidden = false;
  S.errorKind = kind;
}

function clearError(kind) {
  if (kind && S.errorKind !== kind) return;
  $("[data-error]").hidden = true;
  S.errorKind = null;
}

function handleError(err, kind = "load") {
  if (err instanceof ApiError && err.status === 401) {
    showLogin(err.message);
    return;
  }
  showError(err instanceof ApiError ? err.message : `the page failed: ${err && err.message ? err.message : err}`, kind);
}

// ------------------------------------------------------------------------------------------ routes

function parseRoute() {
  const hash = location.hash.replace(/^#/, "") || "/cluster";
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean);
  let view = parts[0] || "cluster";
  let id = null;
  if (view === "jobs" && parts[1]) {
    view = "job";
    id = decodeURIComponent(parts[1]);
  }
  return { view, id, params: new URLSearchParams(query) };
}

async function navigate() {
  const route = parseRoute();
  S.gen += 1;
  S.route = route;
  S.data = {};
  stopLogs();
  pending.topics.clear();
  pending.jobs.clear();
  pending.all = false;
  S.view = VIEWS[route.view] || NOT_FOUND;
  document.body.dataset.view = route.view;
  document.body.dataset.drawn = ""; // the route drawn: set once its first load is drawn
  S.hash = location.hash || "#/cluster";
  for (const a of $$("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === (route.view === "job" ? "jobs" : route.view));
  }
  document.title = `${S.view.title(route)} · peloton`;
  main().innerHTML = S.view.skeleton(route);
  if (S.view.mounted) S.view.mounted(route);
  await refresh(null, S.gen);
}

// Loads what the view needs (all of it, or what `changes` names) and redraws; the counter moves
// either way, so whoever waits for a redraw sees an error drawn too.
async function refresh(changes, gen) {
  const view = S.view;
  try {
    const drew = await view.load(S.route, changes, gen);
    if (gen !== S.gen) return;
    if (drew !== false) {
      const start = performance.now();
      view.draw(S.route, changes);
      // The time each redraw takes, for profiles and benchmarks (performance.getEntriesByType).
      performance.measure(`peloton draw ${S.route.view}`, { start });
    }
    clearError("load");
  } catch (err) {
    if (gen !== S.gen) return;
    handleError(err);
    if (view.failed) view.failed(err);
  }
  if (S.view === view) document.body.dataset.drawn = S.hash; // tests wait on it, with updated
  bump();
}

// ------------------------------------------------------------------------------------------ live updates

const pending = { topics: new Set(), jobs: new Set(), all: false };
let refreshTimer = null;
let refreshing = false;
let lastRefresh = 0;

function queueChange(change) {
  if (change === "all") pending.all = true;
  else {
    for (const t of change.topics || []) pending.topics.add(t);
    for (const j of change.jobs || []) pending.jobs.add(j);
  }
  scheduleRefresh();
}

function scheduleRefresh() {
  if (refreshTimer !== null || refreshing) return;
  if (!pending.all && pending.topics.size === 0) return;
  const wait = Math.max(0, lastRefresh + REFRESH_MS - Date.now());
  refreshTimer = setTimeout(runRefresh, wait);
}

async function runRefresh() {
  refreshTimer = null;
  const all = pending.all;
  const changes = { topics: new Set(pending.topics), jobs: new Set(pending.jobs) };
  pending.all = false;
  pending.topics.clear();
  pending.jobs.clear();
  const view = S.view;
  if (view && (all || view.wants(S.route, changes))) {
    refreshing = true;
    try {
      await refresh(all ? null : changes, S.gen);
    } finally {
      refreshing = false;
      lastRefresh = Date.now();
    }
  }
  scheduleRefresh();
}

function setLive(state) {
  S.live = state;
  const el = $("[data-live]");
  el.dataset.live = state;
  el.textContent = { live: "live", connecting: "connecting", reconnecting: "reconnecting", offline: "offline" }[state] || state;
}

function startEvents() {
  if (S.events) S.events.close();
  const es = new EventSource("api/v1/events");
  S.events = es;
  let missed = false;
  // Whatever changed while the stream was down is fetched again once it is open; and once the
  // daemon says the stream is subscribed (a "connected" event), what changed before (the first
  // load raced the subscription).
  es.addEventListener("open", () => {
    setLive("live");
    if (missed) queueChange("all");
    missed = false;
  });
  es.addEventListener("connected", () => queueChange("all"));
  es.addEventListener("changed", (ev) => {
    let change;
    try {
      change = JSON.parse(ev.data);
    } catch {
      return;
    }
    queueChange(change);
  });
  es.addEventListener("error", () => {
    if (S.events !== es) return;
    missed = true;
    if (es.readyState === EventSource.CLOSED) {
      // Refused (401 once a session expires, say): ask the daemon who we are before retrying.
      setLive("offline");
      es.close();
      S.events = null;
      setTimeout(recheckSession, 3000);
    } else {
      setLive("reconnecting");
    }
  });
}

function stopEvents() {
  if (S.events) S.events.close();
  S.events = null;
  setLive("offline");
}

async function recheckSession() {
  if (S.events) return;
  try {
    S.session = await api("api/v1/session");
    drawWho();
    startEvents();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) showLogin(err.message);
    else setTimeout(recheckSession, 5000);
  }
}

// ------------------------------------------------------------------------------------------ session

function drawWho() {
  const s = S.session;
  const caller = $("[data-caller]");
  const out = $("[data-signout]");
  const daemon = $("[data-daemon]");
  if (!s) {
    caller.textContent = "";
    out.hidden = true;
    daemon.textContent = "";
    return;
  }
  caller.textContent = s.anonymous ? "anonymous" : s.caller;
  caller.title = s.anonymous ? "the daemon serves everyone (no authentication)" : `signed in as ${s.caller} (${s.via})`;
  out.hidden = s.anonymous || !(s.via === "token" || s.via === "jwt");
  daemon.textContent = `v${s.version || "?"}${s.leads === false ? " · follower" : ""}`;
  daemon.title = `daemon ${s.daemon_id || ""}${s.leads ? " (leader)" : s.leads === false ? " (follower: reads may be a second behind)" : ""}`;
}

function showLogin(message) {
  S.gen += 1; // whatever was loading is for a page no longer shown
  stopLogs();
  stopEvents();
  S.session = null;
  drawWho();
  clearError();
  document.title = "Sign in · peloton";
  document.body.dataset.view = "login";
  main().innerHTML = `
    <form class="card login" data-login>
      <h1>Sign in</h1>
      <p class="muted">The daemon needs credentials. Paste your bearer token (a token of the daemon's
      tokens file, or a JWT); it is kept in an HttpOnly cookie for this site only.</p>
      <label for="token">Token</label>
      <input id="token" name="token" type="password" autocomplete="current-password" required>
      <p class="reason" data-login-error>${esc(message || "")}</p>
      <button type="submit" class="primary">Sign in</button>
    </form>`;
  $("[data-login] input[name=token]").focus();
  bump();
}

async function submitLogin(form) {
  const token = form.elements.token.value.trim();
  const err = $("[data-login-error]", form);
  if (!token) {
    err.textContent = "token: empty";
    return;
  }
  const button = $("button[type=submit]", form);
  button.disabled = true;
  try {
    S.session = await api("api/v1/session", { method: "POST", body: { token } });
  } catch (e) {
    err.textContent = e.message;
    button.disabled = false;
    bump();
    return;
  }
  drawWho();
  startEvents();
  await navigate();
}

async function signOut() {
  try {
    await api("api/v1/session", { method: "DELETE" });
  } catch (err) {
    handleError(err, "action");
    return;
  }
  showLogin("Signed out.");
}

// ------------------------------------------------------------------------------------------ confirm

function confirmInPage(text, yes, danger = true) {
  return new Promise((resolve) => {
    const modal = document.createElement("div");
    modal.className = "modal";
    modal.dataset.confirmDialog = "";
    modal.innerHTML = `
      <div class="card" role="dialog" aria-modal="true">
        <p>${esc(text)}</p>
        <div class="row">
          <button type="button" data-cancel>Cancel</button>
          <button type="button" class="${danger ? "danger" : "primary"}" data-confirm>${esc(yes)}</button>
        </div>
      </div>`;
    const done = (answer) => {
      modal.remove();
      document.removeEventListener("keydown", onKey);
      resolve(answer);
    };
    const onKey = (ev) => {
      if (ev.key === "Escape") done(false);
    };
    modal.addEventListener("click", (ev) => {
      if (ev.target.closest("[data-confirm]")) done(true);
      else if (ev.target.closest("[data-cancel]") || ev.target === modal) done(false);
    });
    document.addEventListener("keydown", onKey);
    document.body.append(modal);
    $("[data-cancel]", modal).focus();
  });
}

// ------------------------------------------------------------------------------------------ cluster

function gpuTitle(host, g) {
  const where = `${host.hostname} GPU ${g.index}`;
  switch (g.state) {
    case "used":
      if (g.hidden || !g.job_id) return `${where}: in use by a job you may not view`;
      return `${g.job_name || "job"} (${g.job_id})\nrank ${g.instance_id ?? "?"} · pool ${g.pool ?? "?"}\nsince ${fmtTime(g.since)}\n${where}`;
    case "free":
      return `${where}: free`;
    case "draining":
      return `${where}: free, the host is draining (nothing new is placed here)`;
    case "lost":
      return `${where}: lost (the host is down)`;
    default:
      return `${where}: ${g.state}`;
  }
}

function gpuCell(host, g, label = "", cls = "") {
  const job = g.state === "used" && !g.hidden && g.job_id ? g.job_id : "";
  if (job) ensureColor(job);
  return `<i${cls ? ` class="${cls}"` : ""} data-gpu data-host="${esc(host.hostname)}" data-index="${g.index}" data-state="${esc(g.state)}" data-job="${esc(job)}"${g.state === "used" && !job ? " data-hidden" : ""}${g.instance_id !== null && g.instance_id !== undefined && job ? ` data-instance="${g.instance_id}"` : ""} title="${esc(gpuTitle(host, g))}">${label}</i>`;
}

function gpuColumns(n) {
  if (n <= 3) return ` n${n}`;
  if (n > 8) return " n16";
  return "";
}

function hostTitle(h) {
  const attrs = Object.entries(h.attributes || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  return `${h.hostname} (${h.state})\nGPUs ${h.gpus_free} free of ${h.gpus_total}\nCPUs ${num(h.cpus_used)} used of ${num(h.cpus_total)} · memory ${amount("mem", h.mem_used_mb)} of ${amount("mem", h.mem_total_mb)}${attrs ? `\n${attrs}` : ""}`;
}

function hostCell(h, big) {
  const gpus = h.gpus || [];
  const rank = (g) => (big && g.state === "used" && !g.hidden && g.job_id && g.instance_id !== null ? esc(g.instance_id) : "");
  const cells = gpus.length ? gpus.map((g) => gpuCell(h, g, rank(g))).join("") : `<span class="nogpu">no GPUs</span>`;
  return `<div class="host${S.selectedHost === h.hostname ? " selected" : ""}" data-host-cell="${esc(h.hostname)}" data-host-state="${esc(h.state)}" title="${esc(hostTitle(h))}"><button type="button" class="hn" data-open-host="${esc(h.hostname)}">${esc(big ? h.hostname : h.hostname.split(".")[0])}</button><div class="gpus${gpuColumns(gpus.length)}">${cells}</div></div>`;
}

function rackInner(rack, big) {
  let gpus = 0;
  let free = 0;
  for (const h of rack.hosts) {
    gpus += h.gpus_total;
    free += h.gpus_free;
  }
  const name = rack.rack ? `rack ${esc(rack.rack)}` : "no rack";
  return `<h3>${name} <span class="muted">${plural(rack.hosts.length, "host")} · ${gpus} GPUs · ${free} free</span></h3><div class="hosts">${rack.hosts.map((h) => hostCell(h, big)).join("")}</div>`;
}

const summaryFigures = [
  ["hosts", "hosts"],
  ["hosts_up", "up"],
  ["hosts_draining", "draining"],
  ["hosts_down", "down"],
  ["gpus_total", "GPUs"],
  ["gpus_used", "GPUs in use"],
  ["gpus_free", "GPUs free"],
  ["utilization", "utilization"],
  ["fragmentation", "fragmentation"],
];

const summaryHelp = {
  utilization: "GPUs in use / GPUs of hosts that are up or draining",
  fragmentation: "share of the free GPUs that sit on hosts already partly used (a gang wanting whole hosts cannot use them)",
};

function meter(x) {
  const w = Math.max(0, Math.min(1, x || 0)) * 100;
  return `<div class="meter"><svg viewBox="0 0 100 4" preserveAspectRatio="none"><rect width="${w.toFixed(2)}" height="4" fill="#2f6fb0"/></svg></div>`;
}

function drawSummary(summary) {
  return summaryFigures
    .map(([key, label]) => {
      const v = summary[key];
      const isRatio = key === "utilization" || key === "fragmentation";
      return `<div class="fig"${summaryHelp[key] ? ` title="${esc(summaryHelp[key])}"` : ""}><b data-summary="${key}">${isRatio ? pct(v) : num(v)}</b><span>${label}</span>${isRatio ? meter(v) : ""}</div>`;
    })
    .join("");
}

function drawLegend(racks) {
  const jobs = new Map();
  let hidden = 0;
  for (const rack of racks) {
    for (const h of rack.hosts) {
      for (const g of h.gpus || []) {
        if (g.state !== "used") continue;
        if (g.hidden || !g.job_id) {
          hidden += 1;
          continue;
        }
        const j = jobs.get(g.job_id) || { id: g.job_id, name: g.job_name, pool: g.pool, gpus: 0 };
        j.gpus += 1;
        jobs.set(g.job_id, j);
      }
    }
  }
  const sorted = [...jobs.values()].sort((a, b) => b.gpus - a.gpus || String(a.name).localeCompare(String(b.name)));
  const items = sorted
    .slice(0, LEGEND_JOBS)
    .map(
      (j) =>
        `<a class="item" href="#/jobs/${enc(j.id)}" data-legend-job="${esc(j.id)}" title="${esc(`${j.name} (${j.id}) in ${j.pool}: ${j.gpus} GPUs`)}">${swatch(j.id)}${esc(j.name || shortId(j.id))} <span class="muted">${j.gpus}</span></a>`,
    )
    .join("");
  const more = sorted.length > LEGEND_JOBS ? `<span class="muted">and ${sorted.length - LEGEND_JOBS} more jobs</span>` : "";
  return `<span class="item"><span class="sw free"></span>free</span><span class="item"><span class="sw draining"></span>draining</span><span class="item"><span class="sw lost"></span>lost</span>${hidden ? `<span class="item"><span class="sw hidden"></span>in use, not yours to view (${hidden})</span>` : ""}${items ? `<span class="muted">·</span>${items}${more}` : `<span class="muted">· no job holds a GPU</span>`}`;
}

function findHost(cluster, hostname) {
  if (!cluster) return null;
  for (const rack of cluster.racks) {
    for (const h of rack.hosts) if (h.hostname === hostname) return { host: h, rack: rack.rack };
  }
  return null;
}

function drawHostPanel() {
  const panel = $("#c-hostpanel");
  if (!panel) return;
  const found = S.selectedHost && findHost(S.data.cluster, S.selectedHost);
  if (!found) {
    panel.innerHTML = "";
    return;
  }
  const h = found.host;
  const jobs = new Map();
  for (const g of h.gpus || []) {
    if (g.state === "used" && g.job_id) {
      const j = jobs.get(g.job_id) || { name: g.job_name, ranks: [] };
      j.ranks.push(g.instance_id);
      jobs.set(g.job_id, j);
    }
  }
  const jobList = [...jobs.entries()]
    .map(([id, j]) => `<a href="#/jobs/${enc(id)}">${swatch(id)} ${esc(j.name)}</a> <span class="muted">rank ${j.ranks.join(", ")}</span>`)
    .join("<br>");
  const attrs = Object.entries(h.attributes || {}).map(([k, v]) => `<span class="chip">${esc(k)}=${esc(v)}</span>`).join("");
  const admin = S.session && S.session.admin === false ? "" : `
      ${h.state === "UP" ? `<button type="button" data-host-action="drain" data-hostname="${esc(h.hostname)}">Drain</button>` : ""}
      ${h.state === "DRAINING" ? `<button type="button" data-host-action="undrain" data-hostname="${esc(h.hostname)}">Undrain</button>` : ""}`;
  panel.innerHTML = `
    <div class="card hostpanel" data-host-panel="${esc(h.hostname)}">
      <div class="row"><b>${esc(h.hostname)}</b><span class="badge" data-state="${esc(h.state)}">${esc(h.state)}</span>
        <span class="muted">${found.rack ? `rack ${esc(found.rack)}` : "no rack"}</span><span class="spacer"></span>${admin}
        <button type="button" class="link" data-close-host title="close">&times;</button></div>
      <dl>
        <dt>agent</dt><dd class="mono">${esc(h.agent_id)}</dd>
        <dt>GPUs</dt><dd>${h.gpus_free} free of ${h.gpus_total}</dd>
        <dt>CPUs</dt><dd>${num(h.cpus_used)} used of ${num(h.cpus_total)}</dd>
        <dt>memory</dt><dd>${amount("mem", h.mem_used_mb)} used of ${amount("mem", h.mem_total_mb)}</dd>
        <dt>attributes</dt><dd>${attrs || "—"}</dd>
        <dt>jobs</dt><dd>${jobList || "—"}</dd>
      </dl>
    </div>`;
}

const rackCache = { order: "", html: new Map() };

const CLUSTER = {
  title: () => "Cluster",
  skeleton: () => `
    <div class="summary" id="c-summary"></div>
    <div class="legend" id="c-legend"></div>
    <div id="c-hostpanel"></div>
    <div class="racks" id="c-racks" data-racks><p class="muted">Loading the cluster…</p></div>`,
  mounted() {
    rackCache.order = "";
    rackCache.html.clear();
  },
  wants: (route, ch) => ch.topics.has("cluster"),
  async load(route, ch, gen) {
    const cluster = await api("api/v1/cluster");
    if (gen === S.gen) S.data.cluster = cluster;
  },
  draw() {
    const c = S.data.cluster;
    $("#c-summary").innerHTML = drawSummary(c.summary || {});
    $("#c-legend").innerHTML = drawLegend(c.racks);
    drawHostPanel();
    const container = $("#c-racks");
    const order = c.racks.map((r) => r.rack).join("\u0000");
    if (!c.racks.length) {
      container.innerHTML = `<div class="empty">No host has registered yet.</div>`;
      rackCache.order = "";
      rackCache.html.clear();
      return;
    }
    if (order !== rackCache.order) {
      // The set of racks changed: one section per rack, each filled below.
      const frag = document.createDocumentFragment();
      for (const r of c.racks) {
        const section = document.createElement("section");
        section.className = "rack";
        section.dataset.rack = r.rack;
        frag.append(section);
      }
      container.replaceChildren(frag);
      rackCache.order = order;
      rackCache.html.clear();
    }
    // A small cluster is drawn large, each GPU with the rank it holds.
    const big = c.racks.reduce((n, r) => n + r.hosts.length, 0) <= BIG_HOSTS;
    container.classList.toggle("big", big);
    const sections = container.children;
    c.racks.forEach((r, i) => {
      const html = rackInner(r, big);
      if (rackCache.html.get(r.rack) !== html) {
        sections[i].innerHTML = html; // one innerHTML per rack, only for racks that changed
        rackCache.html.set(r.rack, html);
      }
    });
  },
  failed() {
    const racks = $("#c-racks");
    if (racks && !S.data.cluster) racks.innerHTML = `<div class="empty" data-view-error>${esc($("[data-error-text]").textContent)}</div>`;
  },
};

// ------------------------------------------------------------------------------------------ pools

const KIND_ORDER = ["gpu", "gpus", "cpu", "cpus", "mem_mb", "mem", "disk_mb", "disk"];

function kindsOf(resources) {
  return Object.keys(resources || {}).sort((a, b) => {
    const ia = KIND_ORDER.indexOf(a);
    const ib = KIND_ORDER.indexOf(b);
    return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
  });
}

// One resource kind of a pool as a bar: the reservation (light), what is allocated (solid) and the
// part of it borrowed beyond the reservation (hatched orange), the unused reservation lent to
// others (hatched blue), the entitlement (a dark tick), the limit (a red tick) and the demand (a
// thin amber bar below).
function poolBar(kind, r, scale) {
  const W = 300;
  const x = (v) => Math.max(0, Math.min(W, ((v || 0) / scale) * W)).toFixed(1);
  const res = r.reservation || 0;
  const alloc = r.allocation || 0;
  const own = Math.min(alloc, res);
  const lent = Math.min(r.lent || 0, res);
  const parts = [`<rect width="${W}" height="16" fill="#eef1f5"/>`];
  if (res > 0) parts.push(`<rect width="${x(res)}" height="12" fill="#d5e3f3"><title>reservation ${amount(kind, res)}</title></rect>`);
  if (own > 0) parts.push(`<rect width="${x(own)}" height="12" fill="#2f6fb0"><title>allocated ${amount(kind, alloc)}</title></rect>`);
  if (alloc > res) parts.push(`<rect x="${x(res)}" width="${(x(alloc) - x(res)).toFixed(1)}" height="12" fill="url(#hatch-borrow)"><title>borrowed ${amount(kind, r.borrowed || alloc - res)} beyond the reservation</title></rect>`);
  if (lent > 0) parts.push(`<rect x="${x(res - lent)}" width="${(x(res) - x(res - lent)).toFixed(1)}" height="12" fill="url(#hatch-lend)"><title>lent ${amount(kind, r.lent)} of the reservation to other pools</title></rect>`);
  if ((r.demand || 0) > 0) parts.push(`<rect y="13" width="${x(r.demand)}" height="3" fill="#f2b84b"><title>demand ${amount(kind, r.demand)}</title></rect>`);
  if ((r.entitlement || 0) > 0) parts.push(`<rect x="${Math.max(0, x(r.entitlement) - 1)}" width="2" height="16" fill="#1f2a37"><title>entitlement ${amount(kind, r.entitlement)}</title></rect>`);
  if (r.limit !== null && r.limit !== undefined && r.limit <= scale) parts.push(`<rect x="${Math.max(0, x(r.limit) - 1)}" width="2" height="16" fill="#c2413a"><title>limit ${amount(kind, r.limit)}</title></rect>`);
  return `<svg viewBox="0 0 ${W} 16" preserveAspectRatio="none">${parts.join("")}</svg>`;
}

function poolCard(p, scales) {
  const depth = p.path === "/" ? 0 : Math.min(8, p.path.split("/").length - 1);
  const name = p.path === "/" ? "/" : p.path.split("/").pop();
  const rows = kindsOf(p.resources)
    .filter((kind) => /^gpu/.test(kind) || Object.entries(p.resources[kind]).some(([k, v]) => k !== "share" && typeof v === "number" && v !== 0))
    .map((kind) => {
      const r = p.resources[kind];
      const words = [];
      if ((r.borrowed || 0) > 0) words.push(`<span class="borrow">borrows ${amount(kind, r.borrowed)}</span>`);
      if ((r.lent || 0) > 0) words.push(`<span class="lend">lends ${amount(kind, r.lent)}</span>`);
      return `<tr data-kind="${esc(kind)}"><td><b>${esc(kind)}</b></td><td class="num">${amount(kind, r.reservation)}</td><td class="num">${r.limit === null || r.limit === undefined ? "none" : amount(kind, r.limit)}</td><td class="num">${num(r.share)}</td><td class="num">${amount(kind, r.entitlement)}</td><td class="num">${amount(kind, r.allocation)}</td><td class="num">${amount(kind, r.demand)}</td><td class="bar">${poolBar(kind, r, scales[kind] || 1)}</td><td>${words.join(" · ")}</td></tr>`;
    })
    .join("");
  return `
    <div class="pool d${depth}" data-pool="${esc(p.path)}">
      <div class="title"><b>${esc(name)}</b><span class="mono muted">${p.path === "/" ? "the whole cluster" : esc(p.path)}</span>
        ${p.owner ? `<span>owner ${esc(p.owner)}</span>` : ""}
        <a href="#/queue?pool=${enc(p.path)}" class="${p.queued_gangs ? "" : "muted"}">${plural(p.queued_gangs || 0, "queued gang")}</a>
        ${p.oversized_gangs ? `<span class="reason">${plural(p.oversized_gangs, "gang")} larger than the pool can ever hold</span>` : ""}
        <a href="#/jobs?pool=${enc(p.path)}">jobs</a></div>
      ${rows ? `<table><thead><tr><th>kind</th><th class="num">reservation</th><th class="num">limit</th><th class="num">share</th><th class="num">entitlement</th><th class="num">allocation</th><th class="num">demand</th><th></th><th></th></tr></thead><tbody>${rows}</tbody></table>` : `<p class="muted small">no resources</p>`}
    </div>`;
}

const POOLS = {
  title: () => "Pools",
  skeleton: () => `
    <svg width="0" height="0" aria-hidden="true" class="defs"><defs>
      <pattern id="hatch-borrow" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fbe3c4"/><rect width="3" height="6" fill="#d9822b"/></pattern>
      <pattern id="hatch-lend" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)"><rect width="6" height="6" fill="#d5e3f3"/><rect width="2" height="6" fill="#6d9bd1"/></pattern>
    </defs></svg>
    <div class="keys">
      <span><svg viewBox="0 0 22 10"><rect width="22" height="10" fill="#d5e3f3"/></svg> reservation</span>
      <span><svg viewBox="0 0 22 10"><rect width="22" height="10" fill="#2f6fb0"/></svg> allocation</span>
      <span><svg viewBox="0 0 22 10"><rect width="22" height="10" fill="url(#hatch-borrow)"/></svg> borrowed from others</span>
      <span><svg viewBox="0 0 22 10"><rect width="22" height="10" fill="url(#hatch-lend)"/></svg> lent to others</span>
      <span><svg viewBox="0 0 22 10"><rect y="7" width="22" height="3" fill="#f2b84b"/></svg> demand</span>
      <span><svg viewBox="0 0 22 10"><rect x="10" width="2" height="10" fill="#1f2a37"/></svg> entitlement</span>
      <span><svg viewBox="0 0 22 10"><rect x="10" width="2" height="10" fill="#c2413a"/></svg> limit</span>
    </div>
    <div class="pools" id="p-list"><p class="muted">Loading the pools…</p></div>`,
  wants: (route, ch) => ch.topics.has("pools"),
  async load(route, ch, gen) {
    const pools = await api("api/v1/pools");
    if (gen === S.gen) S.data.pools = pools;
  },
  draw() {
    const pools = S.data.pools.pools || [];
    // One scale per kind across the tree: the largest figure any pool shows for it.
    const scales = {};
    for (const p of pools) {
      for (const [kind, r] of Object.entries(p.resources || {})) {
        const top = Math.max(r.reservation || 0, r.entitlement || 0, r.allocation || 0, r.demand || 0, r.limit ?? 0);
        scales[kind] = Math.max(scales[kind] || 0, top * 1.05);
      }
    }
    $("#p-list").innerHTML = pools.length ? pools.map((p) => poolCard(p, scales)).join("") : `<div class="empty">No pools.</div>`;
  },
  failed() {
    const list = $("#p-list");
    if (list && !S.data.pools) list.innerHTML = `<div class="empty" data-view-error>${esc($("[data-error-text]").textContent)}</div>`;
  },
};

// ------------------------------------------------------------------------------------------ queue

function windowText(w) {
  if (!w) return "";
  const what = w.kind === "reservation" ? "Reserved" : w.kind === "backfill" ? "Backfill window" : esc(w.kind);
  const when = w.start ? ` from ${fmtTime(w.start)} (${new Date(w.start) > new Date() ? `in ${fmtDuration((new Date(w.start) - Date.now()) / 1000)}` : "now"})` : "";
  return `<div class="window" data-window="${esc(w.kind)}">${what}${when}${w.detail ? `: ${esc(w.detail)}` : ""}</div>`;
}

function gangRow(g) {
  const gpus = g.gpus ? ` · ${num(g.gpus)} GPUs` : "";
  return `
    <div class="gang" data-queue-job="${esc(g.job_id)}">
      <div class="pos" title="admitted ${g.position === 1 ? "next" : `after ${g.position - 1} others`}">${g.position}</div>
      <div>
        <div class="row">${swatch(g.job_id)}<a href="#/jobs/${enc(g.job_id)}"><b>${esc(g.job_name || g.job_id)}</b></a><span class="mono muted">${shortId(g.job_id)}</span>
          <span>${plural(g.tasks, "task")}${gpus}</span>${g.owner ? `<span class="muted">by ${esc(g.owner)}</span>` : ""}
          <span class="muted" title="since ${esc(fmtTime(g.waiting_since))}">waiting ${ago(g.waiting_since).replace(" ago", "")}</span></div>
        <div class="reason" data-reason>${g.message ? esc(g.message) : esc(g.reason || "waiting")}${g.reason && g.message ? ` <code class="muted">${esc(g.reason)}</code>` : ""}</div>
        ${windowText(g.window)}
      </div>
    </div>`;
}

const QUEUE = {
  title: () => "Queue",
  skeleton: (route) => {
    const pool = route.params.get("pool");
    const scope = pool ? ` Pool ${esc(pool)} and the pools below it; <a href="#/queue">every pool</a>.` : "";
    return `<p class="muted small">Waiting gangs per pool, in the order the resource manager admits them, each with why it waits.${scope}</p><div class="queue" id="q-list"><p class="muted">Loading the queue…</p></div>`;
  },
  wants: (route, ch) => ch.topics.has("queue"),
  async load(route, ch, gen) {
    const pool = route.params.get("pool");
    const queue = await api(`api/v1/queue${pool ? `?pool=${enc(pool)}` : ""}`);
    if (gen === S.gen) S.data.queue = queue;
  },
  draw() {
    const pools = S.data.queue.pools || [];
    const busy = pools.filter((p) => p.gangs && p.gangs.length);
    const idle = pools.filter((p) => !p.gangs || !p.gangs.length);
    const sections = busy
      .map(
        (p) => `
      <section class="card qpool" data-queue-pool="${esc(p.path)}">
        <h2><a href="#/pools">${esc(p.path)}</a> <span class="muted small">${plural(p.gangs.length, "waiting gang")}</span></h2>
        ${p.gangs.map(gangRow).join("")}
      </section>`,
      )
      .join("");
    const rest = idle.length ? `<p class="muted small">Nothing waiting in ${idle.map((p) => esc(p.path)).join(", ")}.</p>` : "";
    $("#q-list").innerHTML = (sections || `<div class="empty" data-queue-empty>Nothing is waiting.</div>`) + rest;
  },
  failed() {
    const list = $("#q-list");
    if (list && !S.data.queue) list.innerHTML = `<div class="empty" data-view-error>${esc($("[data-error-text]").textContent)}</div>`;
  },
};

// ------------------------------------------------------------------------------------------ jobs

function taskCounts(counts) {
  return Object.entries(counts || {})
    .filter(([, n]) => n > 0)
    .map(([state, n]) => `<span class="badge" data-state="${esc(state)}">${n} ${esc(state)}</span>`)
    .join(" ");
}

function labels(l) {
  return Object.entries(l || {})
    .map(([k, v]) => `<span class="chip">${esc(k)}=${esc(v)}</span>`)
    .join("");
}

function jobRow(j) {
  const why = j.message || j.reason;
  return `
    <tr data-job-row="${esc(j.id)}" data-state="${esc(j.state)}">
      <td>${swatch(j.id)}</td>
      <td><a href="#/jobs/${enc(j.id)}"><b>${esc(j.name || j.id)}</b></a><div class="mono muted small">${esc(j.id)}</div></td>
      <td><span class="badge" data-state="${esc(j.state)}">${esc(j.state)}</span></td>
      <td>${esc(j.pool)}</td>
      <td>${esc(j.owner || "—")}</td>
      <td class="num">${j.instances}</td>
      <td class="num">${num((j.instances || 0) * (j.gpus_per_task || 0))}</td>
      <td>${taskCounts(j.task_counts)}</td>
      <td title="${esc(fmtTime(j.created_at))}">${ago(j.created_at)}</td>
      <td>${why && !TERMINAL.has(j.state) ? `<div class="reason small">${esc(why)}</div>` : why && j.state === "FAILED" ? `<div class="reason small">${esc(why)}</div>` : ""}${labels(j.labels)}</td>
    </tr>`;
}

function filtersForm(params, pools) {
  const states = new Set(params.getAll("state"));
  const pool = params.get("pool") || "";
  const options = [`<option value="">all pools</option>`]
    .concat((pools || []).map((p) => `<option value="${esc(p.path)}"${p.path === pool ? " selected" : ""}>${esc(p.path)}</option>`))
    .join("");
  return `
    <span class="states">${JOB_STATES.map((s) => `<label><input type="checkbox" name="state" value="${s}"${states.has(s) ? " checked" : ""}>${s.toLowerCase()}</label>`).join("")}</span>
    <label>pool <select name="pool">${options}</select></label>
    <label>owner <input name="owner" size="10" value="${esc(params.get("owner") || "")}"></label>
    <label>label <input name="label" size="14" placeholder="key=value" value="${esc(params.get("label") || "")}"></label>
    <label>name <input name="name" size="12" placeholder="prefix" value="${esc(params.get("name") || "")}"></label>
    <button type="submit">Filter</button>`;
}

function applyFilters(form) {
  const q = new URLSearchParams();
  for (const el of form.elements) {
    if (!el.name) continue;
    if (el.type === "checkbox") {
      if (el.checked) q.append(el.name, el.value);
    } else if (el.value.trim()) q.set(el.name, el.value.trim());
  }
  const hash = `#/jobs${q.toString() ? `?${q}` : ""}`;
  history.replaceState(null, "", hash);
  S.route = parseRoute();
  S.hash = location.hash;
  S.gen += 1; // a list asked for with the old filters, still on its way, is dropped
  refresh({ topics: new Set(["jobs"]), jobs: new Set() }, S.gen);
}

const JOBS = {
  title: () => "Jobs",
  skeleton: () => `
    <form class="filters" data-filters></form>
    <div id="j-note" class="muted small"></div>
    <div class="tablewrap"><table>
      <thead><tr><th></th><th>job</th><th>state</th><th>pool</th><th>owner</th><th class="num">tasks</th><th class="num">GPUs</th><th>task states</th><th>created</th><th>why / labels</th></tr></thead>
      <tbody id="j-rows"><tr><td colspan="10" class="muted">Loading the jobs…</td></tr></tbody>
    </table></div>`,
  wants: (route, ch) => ch.topics.has("jobs"),
  async load(route, ch, gen) {
    const q = new URLSearchParams();
    for (const key of ["state", "pool", "label", "owner", "name"]) for (const v of route.params.getAll(key)) q.append(key, v);
    q.set("limit", route.params.get("limit") || "500");
    const [jobs, pools] = await Promise.all([
      api(`api/v1/jobs?${q}`),
      ch && S.data.pools ? S.data.pools : api("api/v1/pools").catch(() => ({ pools: [] })),
    ]);
    if (gen !== S.gen) return false;
    S.data.jobs = jobs;
    if (!S.data.pools) {
      S.data.pools = pools;
      $("[data-filters]").innerHTML = filtersForm(route.params, pools.pools);
    }
    return true;
  },
  draw() {
    const { jobs, truncated } = S.data.jobs;
    $("#j-rows").innerHTML = jobs.length ? jobs.map(jobRow).join("") : `<tr><td colspan="10"><div class="empty" data-jobs-empty>No job matches.</div></td></tr>`;
    $("#j-note").textContent = `${plural(jobs.length, "job")}${truncated ? " (more match: narrow the filters)" : ""}, newest first`;
  },
  failed() {
    const rows = $("#j-rows");
    if (rows && !S.data.jobs) rows.innerHTML = `<tr><td colspan="10"><div class="empty" data-view-error>${esc($("[data-error-text]").textContent)}</div></td></tr>`;
  },
};

// ------------------------------------------------------------------------------------------ job page

function jobHead(d) {
  const j = d.job;
  const actions = d.actions || {};
  const canKill = actions.kill && !TERMINAL.has(j.state);
  const canRestart = actions.restart && j.state !== "PENDING" && j.state !== "KILLING";
  const why = j.message || j.reason;
  return `
    <div class="jobhead">
      ${swatch(j.id)}
      <div class="meta">
        <h1>${esc(j.name || j.id)} <span class="badge" data-state="${esc(j.state)}">${esc(j.state)}</span></h1>
        <div class="mono muted">${esc(j.id)}</div>
        <div class="row small">
          <span>pool <a href="#/jobs?pool=${enc(j.pool)}">${esc(j.pool)}</a></span>
          <span>owner ${esc(j.owner || "—")}</span>
          <span>goal ${esc(j.goal)}</span>
          <span>${plural(j.instances, "task")} × ${num(j.gpus_per_task)} GPU${j.elastic ? " · elastic" : ""}</span>
          <span title="${esc(fmtTime(j.created_at))}">created ${ago(j.created_at)}</span>
          <span title="${esc(fmtTime(j.updated_at))}">updated ${ago(j.updated_at)}</span>
        </div>
        ${why ? `<div class="reason" data-job-reason>${esc(j.message || "")}${j.reason ? ` <code class="muted">${esc(j.reason)}</code>` : ""}</div>` : ""}
        <div>${labels(j.labels)}</div>
        <div class="small">${taskCounts(j.task_counts)}</div>
      </div>
      <div class="actions">
        <button type="button" data-action="restart"${canRestart ? "" : " disabled"} title="${actions.restart ? "kill what runs and start every task again" : "you may not restart this job"}">Restart</button>
        <button type="button" class="danger" data-action="kill"${canKill ? "" : " disabled"} title="${actions.kill ? (TERMINAL.has(j.state) ? "the job has ended" : "stop every task") : "you may not kill this job"}">Kill</button>
      </div>
    </div>`;
}

function jobHosts(d) {
  const id = d.job.id;
  if (!d.hosts || !d.hosts.length) {
    return `<div class="empty">No task of this job holds a host${d.job.state === "PENDING" ? " yet" : " now"}.</div>`;
  }
  const byInstance = new Map(d.tasks.map((t) => [t.instance_id, t]));
  return `<div class="hostsgang">${d.hosts
    .map((hg) => {
      const found = findHost(S.data.cluster, hg.hostname);
      const holds = found && (found.host.gpus || []).some((g) => g.state === "used" && g.job_id === id);
      let cells;
      if (holds) {
        cells = found.host.gpus
          .map((g) => {
            const mine = g.state === "used" && g.job_id === id;
            const label = mine && g.instance_id !== null ? esc(g.instance_id) : "";
            return gpuCell(found.host, g, label, g.state === "used" && !mine ? "other" : "");
          })
          .join("");
        cells = `<div class="gpus${gpuColumns(found.host.gpus.length)}">${cells}</div>`;
      } else {
        const ranks = hg.instances.map((i) => {
          const t = byInstance.get(i);
          return `rank ${i}${t && t.gpu_indices && t.gpu_indices.length ? ` (GPU #${t.gpu_indices.join(", #")})` : ""}`;
        });
        cells = `<div class="small muted">${ranks.join("<br>")}${found ? "<br>no GPU held now" : ""}</div>`;
      }
      return `<div class="host" data-gang-host="${esc(hg.hostname)}"><span class="hn">${esc(hg.hostname)} <span class="muted">${hg.rack ? `rack ${esc(hg.rack)} · ` : ""}rank ${hg.instances.join(", ")}</span></span>${cells}</div>`;
    })
    .join("")}</div>`;
}

function jobTasks(d) {
  const rows = d.tasks
    .map((t) => {
      const why = t.message || t.reason;
      return `<tr data-task-row="${t.instance_id}" class="${logs.instance === t.instance_id ? "selected" : ""}" title="show this task's logs">
        <td class="num">${t.instance_id}</td>
        <td><span class="badge" data-state="${esc(t.state)}">${esc(t.state)}</span></td>
        <td class="num">${t.attempt}</td>
        <td class="nowrap">${esc(t.host || "—")}</td>
        <td class="nowrap">${num(t.gpus)}${t.gpu_indices && t.gpu_indices.length ? ` <span class="muted">#${t.gpu_indices.join(", #")}</span>` : ""}</td>
        <td title="${esc(fmtTime(t.started_at))}">${fmtClock(t.started_at)}</td>
        <td title="${esc(fmtTime(t.ended_at))}">${fmtClock(t.ended_at)}</td>
        <td class="num">${t.failures || 0}</td>
        <td class="small">${why ? `${esc(t.message || "")} <code class="muted">${esc(t.reason || "")}</code>` : ""}</td>
      </tr>`;
    })
    .join("");
  return `<table><thead><tr><th class="num">rank</th><th>state</th><th class="num">attempt</th><th>host</th><th>GPUs</th><th>started</th><th>ended</th><th class="num">failures</th><th>why</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function stateClass(state) {
  if (state === "RUNNING" || state === "STARTING" || state === "LAUNCHED") return "#2e8b57";
  if (state === "SUCCEEDED") return "#2a7f9e";
  if (state === "FAILED" || state === "LOST") return "#c2413a";
  if (state === "KILLED" || state === "KILLING" || state === "PREEMPTING") return "#8b95a3";
  if (state === "PLACING" || state === "PLACED" || state === "LAUNCHING") return "#6d9bd1";
  return "#f2c46b"; // waiting
}

const KIND_COLOR = { restart: "#2f6fb0", resize: "#7b4fc6", preemption: "#d9822b", failure: "#c2413a", attempt: "#1f2a37", job: "#1f2a37" };

// The event timeline: one lane per task (and one for the job), coloured by the state each event
// left it in, with a mark at each restart, resize, preemption and failure; the events below.
function jobTimeline(d) {
  const events = [...(d.events || [])].sort((a, b) => a.sequence - b.sequence);
  if (!events.length) return `<div class="muted">No event yet.</div>`;
  const times = events.map((e) => new Date(e.time).getTime()).filter((t) => !Number.isNaN(t));
  const created = new Date(d.job.created_at).getTime();
  const t0 = times.reduce((a, b) => Math.min(a, b), Number.isNaN(created) ? Infinity : created);
  const ended = TERMINAL.has(d.job.state);
  const t1 = Math.max(ended ? times.reduce((a, b) => Math.max(a, b), t0) : Date.now(), t0 + 1000);
  const W = 1000;
  const x = (t) => (((t - t0) / (t1 - t0)) * W).toFixed(1);
  const lanes = new Map([["job", []]]);
  for (const e of events) {
    const key = e.instance_id === null || e.instance_id === undefined ? "job" : e.instance_id;
    if (!lanes.has(key)) lanes.set(key, []);
    lanes.get(key).push(e);
  }
  const instanceKeys = [...lanes.keys()].filter((k) => k !== "job").sort((a, b) => a - b);
  const shown = ["job", ...instanceKeys.slice(0, TIMELINE_LANES)];
  const lane = (key) => {
    const evs = lanes.get(key) || [];
    const parts = [];
    evs.forEach((e, i) => {
      const start = new Date(e.time).getTime();
      const next = i + 1 < evs.length ? new Date(evs[i + 1].time).getTime() : TERMINAL.has(e.to_state) ? start : t1;
      if (e.to_state && next > start) {
        parts.push(`<rect x="${x(start)}" width="${Math.max(0.8, x(next) - x(start)).toFixed(1)}" y="3" height="8" fill="${stateClass(e.to_state)}"><title>${esc(e.to_state)} from ${esc(fmtClock(e.time))}</title></rect>`);
      }
    });
    for (const e of evs) {
      const mark = e.kind !== "attempt" && e.kind !== "job" ? KIND_COLOR[e.kind] : e.to_state && TERMINAL.has(e.to_state) ? stateClass(e.to_state) : null;
      if (!mark) continue;
      parts.push(`<rect x="${Math.max(0, x(new Date(e.time).getTime()) - 1.5)}" width="3" height="14" fill="${mark}"><title>${esc(`${e.kind}: ${e.from_state || ""} → ${e.to_state || ""} at ${fmtClock(e.time)} ${e.reason || ""} ${e.message || ""}`)}</title></rect>`);
    }
    return `<span class="${key === "job" ? "" : "mono"}">${key === "job" ? "job" : `rank ${key}`}</span><svg viewBox="0 0 ${W} 14" preserveAspectRatio="none"><rect width="${W}" height="14" fill="#f4f6f8"/>${parts.join("")}</svg>`;
  };
  const more = instanceKeys.length > TIMELINE_LANES ? `<p class="muted small">${instanceKeys.length - TIMELINE_LANES} more tasks not drawn; their events are in the list.</p>` : "";
  const rows = events
    .slice(-EVENT_ROWS)
    .reverse()
    .map(
      (e) => `<tr data-event="${e.sequence}" data-kind="${esc(e.kind)}">
        <td class="mono" title="${esc(fmtTime(e.time))}">${esc(fmtClock(e.time))}</td>
        <td><span class="kind" data-kind="${esc(e.kind)}">${esc(e.kind)}</span></td>
        <td class="num">${e.instance_id ?? ""}</td>
        <td class="nowrap">${e.from_state ? `<span class="badge" data-state="${esc(e.from_state)}">${esc(e.from_state)}</span> → ` : ""}${e.to_state ? `<span class="badge" data-state="${esc(e.to_state)}">${esc(e.to_state)}</span>` : ""}</td>
        <td>${esc(e.message || "")} ${e.reason ? `<code class="muted">${esc(e.reason)}</code>` : ""}</td>
        <td class="nowrap">${esc(e.host || "")}</td>
        <td class="mono muted small" title="${esc(e.attempt_id || "")}">${esc(String(e.attempt_id || "").replace(`${d.job.id}-`, ""))}</td>
      </tr>`,
    )
    .join("");
  return `
    <div class="axis"><span>${esc(fmtTime(t0))}</span><span>${ended ? esc(fmtTime(t1)) : "now"}</span></div>
    <div class="lanes">${shown.map(lane).join("")}</div>${more}
    <div class="keys">${[
      ["waiting", "PENDING"],
      ["placing, launching", "PLACING"],
      ["running", "RUNNING"],
      ["succeeded", "SUCCEEDED"],
      ["failed, lost", "FAILED"],
      ["killed", "KILLED"],
    ]
      .map(([label, state]) => `<span><svg viewBox="0 0 22 10"><rect width="22" height="10" fill="${stateClass(state)}"/></svg> ${label}</span>`)
      .join("")}${["restart", "resize", "preemption", "failure"]
      .map((k) => `<span><svg viewBox="0 0 22 10"><rect x="9" width="4" height="10" fill="${KIND_COLOR[k]}"/></svg> ${k}</span>`)
      .join("")}</div>
    <div class="events"><table><thead><tr><th>time</th><th>kind</th><th class="num">rank</th><th>states</th><th>why</th><th>host</th><th>attempt</th></tr></thead><tbody>${rows}</tbody></table></div>`;
}

const JOB = {
  title: (route) => `Job ${shortId(route.id)}`,
  skeleton: (route) => `
    <div data-job-page="${esc(route.id)}">
      <p class="small"><a href="#/jobs">Jobs</a> › <span class="mono">${esc(route.id)}</span></p>
      <div class="card" id="jb-head"><p class="muted">Loading the job…</p></div>
      <div id="jb-body" hidden>
      <h2 id="jb-hosts-title">Gang on the hosts</h2><div id="jb-hosts"></div>
      <h2>Tasks</h2><div class="tablewrap" id="jb-tasks"></div>
      <h2>Timeline</h2><div class="timeline" id="jb-timeline" data-timeline></div>
      <h2>Logs</h2>
      <div class="card logs">
        <div class="controls">
          <label>rank <select data-log-instance></select></label>
          <label>stream <select data-log-stream><option value="stdout">stdout</option><option value="stderr">stderr</option></select></label>
          <label>attempt <select data-log-attempt><option value="0">current</option></select></label>
          <label><input type="checkbox" data-log-follow checked> follow</label>
          <span class="muted small" data-log-status></span>
        </div>
        <pre data-logs></pre>
      </div>
      </div>
    </div>`,
  mounted(route) {
    resetLogs(route.id, null);
  },
  wants(route, ch) {
    return (ch.topics.has("jobs") && (ch.jobs.size === 0 || ch.jobs.has(route.id))) || ch.topics.has("cluster");
  },
  async load(route, ch, gen) {
    const wantJob = !ch || (ch.topics.has("jobs") && (ch.jobs.size === 0 || ch.jobs.has(route.id))) || !S.data.job;
    const detail = wantJob ? await api(`api/v1/jobs/${enc(route.id)}`) : S.data.job;
    if (gen !== S.gen) return false;
    const wantCluster = detail.hosts && detail.hosts.length && (!ch || ch.topics.has("cluster") || !S.data.cluster);
    let cluster = S.data.cluster;
    if (wantCluster) {
      try {
        cluster = await api("api/v1/cluster");
      } catch (err) {
        if (err instanceof ApiError && err.status === 401) throw err;
        cluster = null; // the gang is drawn from the tasks alone
      }
    }
    if (gen !== S.gen) return false;
    S.data.job = detail;
    S.data.cluster = cluster;
    return true;
  },
  draw() {
    const d = S.data.job;
    $("#jb-head").innerHTML = jobHead(d);
    $("#jb-body").hidden = false;
    $("#jb-hosts-title").textContent = TERMINAL.has(d.job.state) ? "Where its tasks ran" : "Gang on the hosts";
    $("#jb-hosts").innerHTML = jobHosts(d);
    $("#jb-tasks").innerHTML = jobTasks(d);
    $("#jb-timeline").innerHTML = jobTimeline(d);
    drawLogInstances(d);
    if (!logs.timer) startLogs();
  },
  failed() {
    const head = $("#jb-head");
    if (head && !S.data.job) head.innerHTML = `<div class="empty" data-view-error>${esc($("[data-error-text]").textContent)}</div>`;
  },
};

// ------------------------------------------------------------------------------------------ logs

const logs = { job: null, instance: null, stream: "stdout", attempt: 0, shown: null, offset: 0, ended: false, busy: false, gen: 0, timer: null, attempts: [] };

function resetLogs(job, instance) {
  logs.gen += 1;
  logs.job = job;
  logs.instance = instance;
  logs.shown = null;
  logs.offset = 0;
  logs.ended = false;
  logs.busy = false;
  logs.attempts = [];
  const pre = $("[data-logs]");
  if (pre) pre.textContent = "";
  const status = $("[data-log-status]");
  if (status) status.textContent = "";
}

function drawLogInstances(d) {
  const select = $("[data-log-instance]");
  if (!select) return;
  const ids = d.tasks.map((t) => t.instance_id);
  if (logs.instance === null || !ids.includes(logs.instance)) {
    if (ids.length) {
      resetLogs(d.job.id, ids[0]);
      logs.stream = $("[data-log-stream]").value;
      logs.attempt = Number($("[data-log-attempt]").value) || 0;
    }
  }
  const html = d.tasks.map((t) => `<option value="${t.instance_id}"${t.instance_id === logs.instance ? " selected" : ""}>${t.instance_id}${t.host ? ` · ${esc(t.host)}` : ""}</option>`).join("");
  if (select.dataset.html !== html) {
    select.innerHTML = html;
    select.dataset.html = html;
  }
  for (const row of $$("[data-task-row]")) row.classList.toggle("selected", Number(row.dataset.taskRow) === logs.instance);
}

function drawLogAttempts() {
  const select = $("[data-log-attempt]");
  if (!select) return;
  const html = `<option value="0"${logs.attempt === 0 ? " selected" : ""}>current${logs.shown ? ` (${logs.shown})` : ""}</option>${logs.attempts
    .slice()
    .sort((a, b) => b - a)
    .map((a) => `<option value="${a}"${logs.attempt === a ? " selected" : ""}>${a}</option>`)
    .join("")}`;
  if (select.dataset.html !== html) {
    select.innerHTML = html;
    select.dataset.html = html;
  }
}

function appendLog(text) {
  const pre = $("[data-logs]");
  if (!pre || !text) return;
  const follow = $("[data-log-follow]").checked;
  pre.append(document.createTextNode(text));
  if (pre.textContent.length > LOG_KEEP) pre.textContent = pre.textContent.slice(-Math.floor(LOG_KEEP * 0.8));
  if (follow) pre.scrollTop = pre.scrollHeight;
}

async function pollLogs() {
  if (logs.busy || S.route.view !== "job" || logs.instance === null || document.hidden) return;
  if (logs.attempt !== 0 && logs.ended) return; // an earlier attempt, read to its end
  const status = $("[data-log-status]");
  const task = S.data.job && S.data.job.tasks.find((t) => t.instance_id === logs.instance);
  if (task && logs.attempts.length === 0) {
    logs.attempts = Array.from({ length: task.attempt }, (_, i) => i + 1);
    drawLogAttempts();
  }
  if (task && logs.attempt === 0 && logs.shown === null && !task.host) {
    // Nothing to read before the task is on a host (and asking would only be refused).
    status.textContent = `rank ${task.instance_id} is not on a host yet (${task.state}): its output shows here once it runs`;
    return;
  }
  logs.busy = true;
  const gen = logs.gen;
  try {
    for (let round = 0; round < 16; round++) {
      const attempt = logs.attempt || logs.shown || 0;
      const q = new URLSearchParams({ stream: logs.stream, offset: String(logs.offset), attempt: String(attempt), length: String(LOG_CHUNK) });
      const r = await api(`api/v1/jobs/${enc(logs.job)}/tasks/${logs.instance}/logs?${q}`);
      if (gen !== logs.gen) return;
      logs.shown = r.attempt;
      logs.attempts = r.attempts || [];
      appendLog(r.data);
      logs.offset = r.next_offset;
      logs.ended = r.ended;
      const newest = logs.attempts.length ? Math.max(...logs.attempts) : r.attempt;
      if (logs.attempt === 0 && r.ended && newest > r.attempt && r.next_offset - r.offset === 0) {
        // The task started again: follow its new attempt from the beginning.
        logs.shown = newest;
        logs.offset = 0;
        logs.ended = false;
        $("[data-logs]").textContent = "";
        continue;
      }
      if (r.next_offset - r.offset < LOG_CHUNK / 2 || !r.data) break;
    }
    drawLogAttempts();
    status.textContent = `rank ${logs.instance} · attempt ${logs.shown} · ${logs.stream}${logs.ended ? " · ended" : " · following"}${$("[data-logs]").textContent ? "" : " · no output yet"}`;
  } catch (err) {
    if (gen !== logs.gen) return;
    if (err instanceof ApiError && err.status === 401) {
      showLogin(err.message);
      return;
    }
    status.textContent = `no logs: ${err.message}`;
  } finally {
    if (gen === logs.gen) logs.busy = false;
  }
}

function startLogs() {
  stopLogs();
  logs.timer = setInterval(pollLogs, LOG_POLL_MS);
  pollLogs();
}

function stopLogs() {
  if (logs.timer) clearInterval(logs.timer);
  logs.timer = null;
}

function onLogControl(el) {
  const instance = Number($("[data-log-instance]").value);
  const stream = $("[data-log-stream]").value;
  const attempt = Number($("[data-log-attempt]").value) || 0;
  const keepAttempts = el.matches("[data-log-attempt]") ? logs.attempts : [];
  resetLogs(logs.job, instance);
  logs.stream = stream;
  logs.attempt = el.matches("[data-log-attempt]") ? attempt : 0;
  logs.attempts = keepAttempts;
  drawLogAttempts();
  for (const row of $$("[data-task-row]")) row.classList.toggle("selected", Number(row.dataset.taskRow) === logs.instance);
  pollLogs();
}

// ------------------------------------------------------------------------------------------ actions

async function jobAction(kind) {
  const d = S.data.job;
  if (!d) return;
  const j = d.job;
  const text =
    kind === "kill"
      ? `Kill job ${j.name || j.id} (${j.id})? Its ${plural(j.instances, "task")} are stopped; this cannot be undone.`
      : `Restart job ${j.name || j.id} (${j.id})? Running tasks are killed and every task starts a new attempt.`;
  if (!(await confirmInPage(text, kind === "kill" ? "Kill" : "Restart", kind === "kill"))) return;
  const buttons = $$("[data-action]");
  for (const b of buttons) b.disabled = true;
  const gen = S.gen;
  try {
    const r = await api(`api/v1/jobs/${enc(j.id)}/${kind}`, { method: "POST" });
    if (gen !== S.gen) return;
    clearError("action");
    if (r && r.job) S.data.job = { ...S.data.job, job: r.job };
    queueChange({ topics: ["jobs"], jobs: [j.id] });
    JOB.draw(S.route);
    bump();
  } catch (err) {
    if (gen !== S.gen) return;
    handleError(err, "action");
    if (S.data.job) $("#jb-head").innerHTML = jobHead(S.data.job);
    bump();
  }
}

async function hostAction(kind, hostname) {
  const text =
    kind === "drain"
      ? `Drain ${hostname}? Nothing new is placed there; what runs keeps running until it ends or is moved.`
      : `Undrain ${hostname}? It takes new tasks again.`;
  if (!(await confirmInPage(text, kind === "drain" ? "Drain" : "Undrain", kind === "drain"))) return;
  try {
    await api(`api/v1/hosts/${enc(hostname)}/${kind}`, { method: "POST" });
    clearError("action");
    queueChange({ topics: ["cluster"], jobs: [] });
  } catch (err) {
    handleError(err, "action");
    bump();
  }
}

// ------------------------------------------------------------------------------------------ wiring

const NOT_FOUND = {
  title: () => "Not found",
  skeleton: (route) => `<div class="empty" data-view-error>No page here: #/${esc(route.view)}. Try <a href="#/cluster">the cluster</a>.</div>`,
  wants: () => false,
  async load() {
    return false;
  },
  draw() {},
};

const VIEWS = { cluster: CLUSTER, pools: POOLS, queue: QUEUE, jobs: JOBS, job: JOB };

function highlightJob(id) {
  const racks = $("[data-racks]");
  if (!racks) return;
  for (const el of $$(".hl", racks)) el.classList.remove("hl");
  racks.classList.toggle("dim", Boolean(id));
  if (id) for (const el of $$(`[data-gpu][data-job="${CSS.escape(id)}"]`, racks)) el.classList.add("hl");
}

function wire() {
  document.addEventListener("click", (ev) => {
    const t = ev.target;
    if (!(t instanceof Element)) return;
    let el;
    if ((el = t.closest("[data-dismiss]"))) clearError();
    else if ((el = t.closest("[data-signout]"))) signOut();
    else if ((el = t.closest("[data-action]"))) {
      if (!el.disabled) jobAction(el.dataset.action);
    } else if ((el = t.closest("[data-host-action]"))) hostAction(el.dataset.hostAction, el.dataset.hostname);
    else if ((el = t.closest("[data-close-host]"))) {
      S.selectedHost = null;
      for (const h of $$(".host.selected")) h.classList.remove("selected");
      drawHostPanel();
    } else if ((el = t.closest("[data-open-host]"))) {
      S.selectedHost = el.dataset.openHost;
      for (const h of $$(".host.selected")) h.classList.remove("selected");
      el.closest("[data-host-cell]").classList.add("selected");
      rackCache.html.clear(); // the selection is part of a rack's HTML
      drawHostPanel();
    } else if ((el = t.closest("[data-gpu][data-state=used]"))) {
      if (el.dataset.job && S.route.view === "cluster") location.hash = `#/jobs/${enc(el.dataset.job)}`;
    } else if ((el = t.closest("[data-task-row]"))) {
      const select = $("[data-log-instance]");
      if (select) {
        select.value = el.dataset.taskRow;
        onLogControl(select);
      }
    }
  });
  document.addEventListener("change", (ev) => {
    const t = ev.target;
    if (!(t instanceof Element)) return;
    if (t.closest("[data-filters]")) applyFilters(t.closest("[data-filters]"));
    else if (t.matches("[data-log-instance], [data-log-stream], [data-log-attempt]")) onLogControl(t);
    else if (t.matches("[data-log-follow]") && t.checked) {
      const pre = $("[data-logs]");
      pre.scrollTop = pre.scrollHeight;
    }
  });
  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement)) return;
    ev.preventDefault();
    if (form.matches("[data-login]")) submitLogin(form);
    else if (form.matches("[data-filters]")) applyFilters(form);
  });
  document.addEventListener("mouseover", (ev) => {
    const item = ev.target instanceof Element && ev.target.closest("[data-legend-job]");
    if (item) highlightJob(item.dataset.legendJob);
  });
  document.addEventListener("mouseout", (ev) => {
    const item = ev.target instanceof Element && ev.target.closest("[data-legend-job]");
    if (item && !(ev.relatedTarget instanceof Element && item.contains(ev.relatedTarget))) highlightJob(null);
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && S.route.view === "job") pollLogs();
  });
  window.addEventListener("hashchange", () => {
    if (S.session) navigate();
  });
}

async function start() {
  wire();
  try {
    S.session = await api("api/v1/session");
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      showLogin("");
      return;
    }
    showError(err.message);
    S.session = { anonymous: true, caller: "", via: "none" };
  }
  drawWho();
  startEvents();
  await navigate();
}

start().catch((err) => {
  showError(`the page failed to start: ${err && err.message ? err.message : err}`);
  bump();
});
