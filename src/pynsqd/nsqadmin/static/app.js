// nsqadmin's pages: one small app over the JSON API, polled every 2 s. The charts draw the
// samples the server keeps per page (the last five minutes, nsqadmin/history.py), so a reload
// keeps them; no Graphite needed.
"use strict";
const BASE = document.body.dataset.base || "";
const route = location.pathname.slice(BASE.length).replace(/^\/+|\/+$/g, "").split("/").map(decodeURIComponent);
const main = document.getElementById("main");
const crumbsEl = document.getElementById("crumbs");
const errorsEl = document.getElementById("errors");

function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])); }
function href(path) { return `${BASE}/${path.split("/").map(encodeURIComponent).join("/")}`; }
function link(path, text) { return `<a href="${href(path)}">${esc(text)}</a>`; }
function num(n) { return Number(n || 0).toLocaleString("en-US"); }
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; n = Number(n || 0);
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
function ago(unixSeconds) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - unixSeconds));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s ago`;
  return `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m ago`;
}
async function api(path, init) {
  const r = await fetch(`${BASE}/api/${path}`, init);
  const body = r.status === 200 && (init || {}).method ? null : await r.json().catch(() => null);
  if (r.status !== 200) throw new Error((body && body.message) || `HTTP ${r.status}`);
  // A node that does not answer is a line under the page, not a failed page.
  if (body && body.errors) errorsEl.textContent = body.errors.join("; ");
  return body;
}

// -- charts: SVG with a value axis (0 to the rounded maximum, with the unit) and a time axis --

function niceMax(v) {
  if (v <= 1) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}
function clock(ms) { return new Date(ms).toTimeString().slice(0, 8); }
// Samples further apart than this were taken with no page open: the line breaks there.
const GAP_MS = 10000;
function chart(id, label, unit, points) {
  // points: [[unix ms, value], ...]
  const W = 420, H = 150, L = 56, R = 10, T = 10, B = 24, w = W - L - R, h = H - T - B;
  if (points.length < 2) {
    // One sample is no line (and a rate needs two): say so, with no time axis.
    return `<figure><figcaption>${esc(label)}</figcaption><svg class="chart" id="${id}" data-points="${points.length}" width="${W}" height="${H}" role="img" aria-label="${esc(label)}">` +
      `<text x="${W / 2}" y="${H / 2}" text-anchor="middle" class="waiting">collecting samples (one every 2 s while this page is open)</text></svg></figure>`;
  }
  const vals = points.map(p => p[1]);
  const max = niceMax(Math.max(0, ...vals));
  const t0 = points.length ? points[0][0] : Date.now(), t1 = points.length ? points[points.length - 1][0] : t0;
  const span = Math.max(1, t1 - t0);
  const x = t => L + (t - t0) * w / span, y = v => T + h - v * h / max;
  // One polyline per run of samples with no gap between them.
  const runs = [[]];
  points.forEach((p, i) => {
    if (i && p[0] - points[i - 1][0] > GAP_MS) runs.push([]);
    runs[runs.length - 1].push(`${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
  });
  const grid = [0, 0.5, 1].map(f => {
    const v = max * f, yy = y(v).toFixed(1);
    return `<line x1="${L}" x2="${W - R}" y1="${yy}" y2="${yy}" stroke="#ddd"/>` +
      `<text x="${L - 6}" y="${(+yy + 4).toFixed(1)}" text-anchor="end" class="tick">${num(v)}</text>`;
  }).join("");
  const last = vals.length ? vals[vals.length - 1] : 0;
  return `<figure><figcaption>${esc(label)}: <span data-last="${id}">${num(Math.round(last))}</span> ${esc(unit)}</figcaption>` +
    `<svg class="chart" id="${id}" data-points="${points.length}" width="${W}" height="${H}" role="img" aria-label="${esc(label)}">` +
    grid + `<text x="12" y="${T + h / 2}" class="unit" transform="rotate(-90 12 ${T + h / 2})" text-anchor="middle">${esc(unit)}</text>` +
    `<text x="${L}" y="${H - 6}" class="tick" data-axis="start">${points.length ? clock(t0) : ""}</text>` +
    `<text x="${W - R}" y="${H - 6}" class="tick" text-anchor="end" data-axis="end">${points.length ? clock(t1) : ""}</text>` +
    runs.map(r => `<polyline fill="none" stroke="#2a7ae2" stroke-width="2" points="${r.join(" ")}"/>`).join("") +
    `</svg></figure>`;
}
function rates(history) {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const dt = (history[i][0] - history[i - 1][0]) / 1000;
    if (dt * 1000 > GAP_MS) continue;  // across a gap: no rate (the line breaks there)
    out.push([history[i][0], dt > 0 ? Math.max(0, (history[i][2] - history[i - 1][2]) / dt) : 0]);
  }
  return out;
}
function graphite(urls) {
  // --graphite-url: Graphite's own rendering of the same series over the last hours.
  if (!urls) return "";
  return `<div class="charts graphite">` + Object.entries(urls).map(([k, u]) =>
    `<figure><figcaption>${k === "rate" ? "published" : "depth"}, last 2 hours (Graphite)</figcaption>` +
    `<img id="graphite-${k}" src="${esc(u)}" width="420" height="150" alt="${k} from Graphite"></figure>`).join("") + `</div>`;
}
function charts(history, depthLabel, urls) {
  return `<div class="charts">` + chart("depth-chart", depthLabel, "messages", history.map(s => [s[0], s[1]])) +
    chart("rate-chart", "published", "messages/s", rates(history)) + `</div>` + graphite(urls);
}

// -- tables ---------------------------------------------------------------------------------

const CHANNEL_COLS = [
  ["depth", "Depth"], ["memory", "Memory + Disk"], ["in_flight_count", "In Flight"],
  ["deferred_count", "Deferred"], ["requeue_count", "Requeued"], ["timeout_count", "Timed Out"],
  ["message_count", "Messages"], ["clients", "Connections"]];
function cell(row, key) {
  if (key === "memory") return `${num(row.depth - (row.backend_depth || 0))} + ${num(row.backend_depth || 0)}`;
  return num(row[key]);
}
function table(id, first, cols, rows, total) {
  const head = `<tr><th>${esc(first)}</th>${cols.map(c => `<th>${esc(c[1])}</th>`).join("")}</tr>`;
  const body = rows.map(r => `<tr><td>${r.label}</td>${cols.map(c => `<td>${cell(r, c[0])}</td>`).join("")}</tr>`).join("");
  let foot = "";
  if (total && rows.length) {
    const sum = {};
    for (const c of cols) sum[c[0]] = rows.reduce((a, r) => a + Number(r[c[0]] || 0), 0);
    sum.backend_depth = rows.reduce((a, r) => a + Number(r.backend_depth || 0), 0);
    sum.depth = rows.reduce((a, r) => a + Number(r.depth || 0), 0);
    foot = `<tr class="total"><td>Total</td>${cols.map(c => `<td>${cell(sum, c[0])}</td>`).join("")}</tr>`;
  }
  return `<table id="${id}">${head}${body}${foot}</table>`;
}
function paused(p) { return p ? ' <span class="paused">paused</span>' : ""; }

// -- actions ----------------------------------------------------------------------------------

function buttons(isPaused) {
  const kinds = {pause: "warn", unpause: "", empty: "danger", delete: "danger"};
  return `<div class="actions">` + ["pause", "unpause", "empty", "delete"].filter(a => a !== (isPaused ? "pause" : "unpause"))
    .map(a => `<button data-action="${a}" class="${kinds[a]}">${a[0].toUpperCase() + a.slice(1)}</button>`).join("") +
    `<span id="refused" class="refused"></span></div>`;
}
// What the page says back (a refusal, a creation) and what is typed in the create form: kept
// across the 2 s redraws until the next action, as Go's red banner stays.
const said = {refused: "", created: "", topic: "", channel: ""};
function showSaid() {
  const r = document.getElementById("refused"), c = document.getElementById("created");
  if (r) r.textContent = said.refused;
  if (c) c.textContent = said.created;
}
function refused(e) { said.refused = `refused: ${e.message}`; said.created = ""; showSaid(); }
async function act(path, action) {
  if (!confirm(`${action} ${path}?`)) return;
  const init = action === "delete" ? {method: "DELETE"} :
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({action})};
  try {
    await api(`topics/${path.split("/").map(encodeURIComponent).join("/")}`, init);
    if (action === "delete") location.href = `${BASE}/topics`; else render();
  } catch (e) { refused(e); }
}
async function tombstone(node, topic) {
  if (!confirm(`tombstone topic ${topic} on node ${node}?`)) return;
  try {
    await api(`nodes/${encodeURIComponent(node)}`, {method: "DELETE", headers: {"Content-Type": "application/json"}, body: JSON.stringify({topic})});
    render();
  } catch (e) { refused(e); }
}
const CREATE_FORM = `<form id="create" class="create"><h2>Create a topic or channel</h2>` +
  `<input name="topic" placeholder="topic" required> <input name="channel" placeholder="channel (optional)"> ` +
  `<button type="submit">Create</button> <span id="created"></span><span id="refused" class="refused"></span></form>`;
async function create(form) {
  const topic = form.topic.value.trim(), channel = form.channel.value.trim();
  try {
    await api("topics", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({topic, channel})});
    Object.assign(said, {refused: "", created: `created ${topic}${channel ? "/" + channel : ""}`, topic: "", channel: ""});
    (document.getElementById("create") || form).reset();
    showSaid();
    render();
  } catch (e) { refused(e); }
}

// -- pages --------------------------------------------------------------------------------------

function crumbs(parts) {
  // parts: [[path or null, text], ...]
  crumbsEl.innerHTML = parts.map(([p, t]) => p ? link(p, t) : `<span>${esc(t)}</span>`).join(" › ");
}

async function channelPage(t, c) {
  const d = await api(`topics/${encodeURIComponent(t)}/${encodeURIComponent(c)}`);
  crumbs([["topics", "Topics"], [`topics/${t}`, t], [null, c]]);
  const nodes = d.nodes.map(n => ({...n, label: link(`nodes/${n.node}`, n.node) + paused(n.paused)}));
  return `<h1>${esc(t)} / ${esc(c)}${paused(d.paused)}</h1>` + buttons(d.paused) + charts(d.history, "queued", d.graphite) +
    `<h2>Nodes</h2>` + table("nodes", "Node", CHANNEL_COLS, nodes, true) +
    `<h2>Publish-to-FIN latency</h2><table id="e2e"><tr><th>Node</th><th>Samples</th><th>Percentiles (ms)</th></tr>` +
    d.nodes.map(n => `<tr><td>${esc(n.node)}</td><td>${num(n.e2e ? n.e2e.count : 0)}</td><td>${n.e2e && n.e2e.percentiles ? n.e2e.percentiles.map(p => `p${p.quantile * 100}: ${(p.value / 1e6).toFixed(1)}`).join(", ") : "–"}</td></tr>`).join("") + "</table>" +
    (d.nodes.some(n => n.e2e && n.e2e.percentiles) ? "" : `<p class="hint" id="e2e-hint">No percentiles: start nsqd with <code>--e2e-processing-latency-percentile=0.99</code> (and more) to measure them.</p>`) +
    (d.nodes.some(n => n.lifecycle) ? `<h2>Lifecycle</h2><table id="lifecycle"><tr><th>Node</th><th>Dead-lettered</th><th>Expired</th><th>Dropped</th><th>Over bound</th><th>Max attempts</th><th>TTL</th><th>Max depth</th></tr>` +
      d.nodes.filter(n => n.lifecycle).map(n => `<tr><td>${esc(n.node)}</td><td>${num(n.lifecycle.dead_letter_count)}</td><td>${num(n.lifecycle.expired_count)}</td><td>${num(n.lifecycle.dropped_count)}</td><td>${num(n.lifecycle.over_bound_count)}</td><td>${n.lifecycle.max_attempts || "–"}</td><td>${esc(n.lifecycle.msg_ttl || "–")}</td><td>${n.lifecycle.max_depth || "–"}</td></tr>`).join("") + "</table>" : "") +
    `<h2>Clients</h2>` + clientsTable(d.clients, false) + messagesTables(d.messages);
}

// What waits in the channel (pynsqd's GET /channel/peek): nothing is consumed by looking.
function messagesTables(m, where = "channel") {
  if (!m) return "";
  const when = ms => ms ? `${new Date(ms).toISOString().slice(11, 23)} UTC` : "";
  const body = r => `<code class="body">${esc(r.body)}</code>${r.encoding === "hex" ? " <small>(hex)</small>" : ""}${r.truncated ? ` <small>(${num(r.size)} bytes)</small>` : ""}`;
  // pynsqd's message headers (docs/headers.md): each value shown as a body is (hex, cut).
  const hdrs = r => r.headers_undecodable ? "<small>(undecodable)</small>" :
    (r.headers || []).map(h => `<code class="header">${esc(h.name)}: ${esc(h.body)}</code>${h.encoding === "hex" ? " <small>(hex)</small>" : ""}`).join("<br>");
  const section = (id, title, extra, rows, cells) => `<h3>${title} <small>(${rows.length ? `first ${rows.length}` : "none"})</small></h3>` +
    (rows.length ? `<table id="${id}"><tr><th>Node</th><th>ID</th><th>Published</th><th>Attempts</th>${extra.map(h => `<th>${h}</th>`).join("")}<th>Headers</th><th>Body</th></tr>` +
      rows.map(r => `<tr><td>${esc(r.node)}</td><td><code>${esc(r.id)}</code></td><td>${when(r.timestamp)}</td><td>${r.attempts}</td>${cells(r).map(c => `<td>${c}</td>`).join("")}<td>${hdrs(r)}</td><td>${body(r)}</td></tr>`).join("") + "</table>" : "");
  if (where === "topic" && !m.queued.length) return "";  // handed to its channels as it comes
  return `<h2>Messages</h2><p class="hint">What waits in the ${where}${where === "topic" ? " (not yet handed to a channel)" : ""}, oldest first, as the nodes hold it now; looking consumes nothing.</p>` +
    section("peek-queued", "Queued", [], m.queued, () => []) +
    section("peek-requeued", "Requeued", [], m.requeued, () => []) +
    (where === "channel" ? section("peek-deferred", "Deferred", ["Due"], m.deferred, r => [when(r.due)]) +
    section("peek-in-flight", "In flight", ["Client", "Deadline"], m.in_flight, r => [esc(r.client || ""), when(r.deadline)]) : "");
}

// A client as Go's nsqadmin names it: its id and the port it connects from (one host's clients
// share a hostname).
function clientName(k) {
  const port = String(k.remote_address || "").split(":").pop();
  const name = k.client_id || k.hostname || "";
  return port && /^\d+$/.test(port) ? `${name}:${port}` : name;
}
function clientsTable(clients, where) {
  return `<table id="clients"><tr><th>Client</th>${where ? "<th>Topic / Channel</th>" : "<th>Node</th>"}<th>Address</th><th>Connected</th><th>User agent</th><th>In Flight</th><th>Ready</th><th>Finished</th><th>Requeued</th><th>TLS</th><th>Compression</th></tr>` +
    clients.map(k => `<tr><td>${esc(clientName(k))}${k.hostname && k.hostname !== k.client_id ? ` <small>(${esc(k.hostname)})</small>` : ""}</td>` +
      `<td>${where ? esc(`${k.topic} / ${k.channel}`) : link(`nodes/${k.node}`, k.node)}</td><td>${esc(k.remote_address || "")}</td>` +
      `<td title="${k.connect_ts ? new Date(k.connect_ts * 1000).toISOString() : ""}">${k.connect_ts ? ago(k.connect_ts) : ""}</td>` +
      `<td>${esc(k.user_agent || "")}</td><td>${num(k.in_flight_count)}</td><td>${num(k.ready_count)}</td><td>${num(k.finish_count)}</td><td>${num(k.requeue_count)}</td>` +
      `<td>${k.tls ? esc(k.tls_version || "yes") : "–"}</td><td>${k.snappy ? "snappy" : k.deflate ? "deflate" : "–"}</td></tr>`).join("") + "</table>";
}

async function topicPage(t) {
  const d = await api(`topics/${encodeURIComponent(t)}`);
  crumbs([["topics", "Topics"], [null, t]]);
  const channels = d.channels.map(c => ({...c, label: link(`topics/${t}/${c.channel}`, c.channel) + paused(c.paused)}));
  const nodes = d.nodes.map(n => ({...n, label: link(`nodes/${n.node}`, n.node) + paused(n.paused)}));
  const logged = d.nodes.filter(n => n.log);
  const copies = d.copies || [];  // a replicated topic: its partitions' copies, wherever held
  return `<h1>${esc(t)}${paused(d.paused)}</h1>` + buttons(d.paused) + charts(d.history, "queued (topic and channels)", d.graphite) +
    `<h2>Channels</h2>` + table("channels", "Channel", CHANNEL_COLS, channels, false) +
    `<h2>Nodes</h2>` + table("topic-nodes", "Node", [["depth", "Depth"], ["memory", "Memory + Disk"], ["in_flight_count", "In Flight"],
      ["deferred_count", "Deferred"], ["message_count", "Messages"], ["channels", "Channels"]], nodes, true) +
    (copies.length ? `<h2>Retained log</h2><p class="hint">A replicated topic: each node's partition (named by its origin node's id) and every copy of it, on whichever node holds it now.</p><table id="log-copies"><tr><th>Partition (origin node id)</th><th>Node</th><th>Role</th><th>Earliest offset</th><th>Latest offset</th><th>Records</th><th>Committed offset</th><th>Size</th><th>Segments</th></tr>` +
      copies.map(c => `<tr><td>${c.partition}</td><td>${esc(c.node)}</td><td>${esc(c.role)}</td><td>${num(c.earliest)}</td><td>${num(c.latest)}</td><td>${num(c.latest - c.earliest)}</td><td>${num(c.committed)}</td><td>${bytes(c.bytes)}</td><td>${num(c.segments)}</td></tr>`).join("") + "</table>" :
    logged.length ? `<h2>Retained log</h2><table id="log"><tr><th>Node</th><th>Earliest offset</th><th>Latest offset</th><th>Records</th><th>Size</th><th>Segments</th><th>Not yet handed to channels</th><th>Duplicates dropped</th></tr>` +
      logged.map(n => `<tr><td>${esc(n.node)}</td><td>${num(n.log.earliest_offset)}</td><td>${num(n.log.latest_offset)}</td><td>${num(n.log.latest_offset - n.log.earliest_offset)}</td><td>${bytes(n.log.bytes)}</td><td>${num(n.log.segments)}</td><td>${num(n.depth)}</td><td>${num(n.log.duplicate_count || 0)}</td></tr>`).join("") + "</table>" : "") +
    ((d.readers || []).length ? `<h2>Log readers</h2><p class="hint">Readers that keep their own offsets (a Spark query in log mode, by its readerName), as each last reported a commit.</p><table id="log-readers"><tr><th>Reader</th><th>Node</th><th>Partition</th><th>Committed offset</th><th>Lag (records)</th><th>Reported</th></tr>` +
      d.readers.map(r => `<tr><td>${esc(r.reader)}</td><td>${esc(r.node)}</td><td>${esc(String(r.partition))}</td><td>${num(r.committed)}</td><td>${num(r.lag)}</td><td>${esc(new Date(r.updated * 1000).toISOString())}</td></tr>`).join("") + "</table>" : "") +
    ((d.partitions || []).length ? `<h2>Replicated partitions</h2><table id="partitions"><tr><th>Partition (origin node id)</th><th>Leader</th><th>Epoch</th><th>In sync</th><th>Replicas</th><th>Committed offset</th><th>Follower lag (records)</th><th>Where consumers are (per node and channel)</th></tr>` +
      d.partitions.map(p => `<tr><td>${p.partition}</td><td>${esc(p.node)} (id ${p.leader})</td><td>${p.epoch}</td><td>${esc(p.isr.join(", "))}</td><td>${esc(p.replicas.join(", "))}</td><td>${num(p.committed)}</td><td>${esc(Object.entries(p.follower_lag).map(([f, l]) => `${f}: ${l}`).join(", "))}</td><td>${checkpoints(p.checkpoints || {})}</td></tr>`).join("") + "</table>" : "") +
    messagesTables(d.messages, "topic");
}

// A partition's channel checkpoints, by node, in an operator's words: where each channel's
// consumers are (everything before that offset finished, and how many later ranges finished
// out of order), or which node's consumers took that node's channels over after it died.
function checkpoints(byHolder) {
  return Object.entries(byHolder).map(([holder, chans]) => chans.adopted_by !== undefined
    ? `node ${esc(holder)}'s consumers moved to node ${esc(String(chans.adopted_by))} (its messages up to offset ${num(chans.end)})`
    : `node ${esc(holder)}: ` + Object.entries(chans).map(([c, w]) =>
        `${esc(c)} done up to offset ${num(w.low)}${w.end === null ? "" : ` of ${num(w.end)}`}${w.done_ranges ? ` (and ${w.done_ranges} later ranges)` : ""}`).join(", ")
  ).join("; ");
}

async function nodePage(name) {
  const d = await api(`nodes/${encodeURIComponent(name)}`);
  crumbs([["nodes", "Nodes"], [null, name]]);
  const topics = d.topics.map(t => ({...t, label: link(`topics/${t.topic}`, t.topic) + paused(t.paused)}));
  const channels = d.channels.map(c => ({...c, label: link(`topics/${c.topic}/${c.channel}`, `${c.topic} / ${c.channel}`) + paused(c.paused)}));
  return `<h1>${esc(name)}</h1><p class="meta">nsqd ${esc(d.version || "?")}, health ${esc(d.health || "?")}${d.start_time ? `, started ${ago(d.start_time)}` : ""}</p>` +
    `<h2>Topics</h2>` + table("node-topics", "Topic", [["depth", "Depth"], ["memory", "Memory + Disk"], ["message_count", "Messages"], ["channels", "Channels"]], topics, true) +
    `<h2>Channels</h2>` + table("node-channels", "Topic / Channel", CHANNEL_COLS, channels, true) +
    `<h2>Clients</h2>` + clientsTable(d.clients, true);
}

async function nodesPage() {
  const d = await api("nodes");
  crumbs([[null, "Nodes"]]);
  return `<h1>Nodes</h1><table id="nodes"><tr><th>Node</th><th>Hostname</th><th>Broadcast Address</th><th>TCP Port</th><th>HTTP Port</th><th>Version</th><th>Health</th><th>Lookupd Conns</th><th>Topics</th></tr>` +
    d.nodes.map(n => `<tr${n.down_since ? ' class="down"' : ""}><td>${link(`nodes/${n.node}`, n.node)}</td><td>${esc(n.hostname)}</td><td>${esc(n.broadcast_address)}</td><td>${n.tcp_port || ""}</td><td>${n.http_port || ""}</td><td>${esc(n.version)}</td><td>${n.down_since ? `<span class="down-mark">down</span> ${esc(`last answer ${ago(n.down_since)}`)}` : esc(n.health)}</td><td>${n.lookupd_connections}</td><td>${num(n.topics)}</td></tr>`).join("") + "</table>";
}

async function lookupPage() {
  const d = await api("lookup");
  crumbs([[null, "Lookup"]]);
  return "<h1>nsqlookupd</h1>" +
    (d.inactive_topics.length ? `<div id="inactive" class="notice"><strong>Inactive topics</strong>: known to nsqlookupd, produced on no live nsqd: ${d.inactive_topics.map(esc).join(", ")}</div>` : "") +
    d.lookupds.map(l =>
      `<h2>${esc(l.lookupd)}</h2><table class="lookup"><tr><th>Node</th><th>Version</th><th>Topics</th></tr>` +
      l.producers.map(p => `<tr><td>${link(`nodes/${p.node}`, p.node)}</td><td>${esc(p.version)}</td><td>` +
        `<ul class="lookup-topics">` + p.topics.map(t => `<li>` + (t.tombstoned ? `<s>${esc(t.topic)}</s> (tombstoned)` :
          `${esc(t.topic)} <button class="danger small" data-tombstone="${esc(t.topic)}" data-node="${esc(p.node)}">tombstone</button>`) + `</li>`).join("") + `</ul>` +
        "</td></tr>").join("") + "</table>").join("") + CREATE_FORM;
}

async function counterPage() {
  const d = await api("topics");
  crumbs([[null, "Counter"]]);
  const total = d.topics.reduce((a, t) => a + t.message_count, 0);
  return `<h1>Messages published</h1><div class="counter" id="counter">${num(total)}</div>` +
    `<div class="charts">` + chart("rate-chart", "rate", "messages/s", rates(d.history)) + `</div>` + graphite(d.graphite);
}

async function topicsPage() {
  const d = await api("topics");
  crumbs([[null, "Topics"]]);
  return `<h1>Topics</h1><table id="topics"><tr><th>Topic</th><th>Depth</th><th>Messages</th><th>Channels</th><th>Nodes</th></tr>` +
    d.topics.map(t => `<tr><td>${link(`topics/${t.topic}`, t.topic)}${paused(t.paused)}${t.inactive ? ' <span class="inactive" title="known to nsqlookupd, on no node yet">inactive</span>' : ""}</td><td>${num(t.depth)}</td><td>${num(t.message_count)}</td><td>${t.channels}</td><td>${t.nodes.length}</td></tr>`).join("") +
    "</table>" + CREATE_FORM;
}

let drawn = null;  // the page's HTML as last drawn

async function render() {
  try {
    let html;
    if (route[0] === "topics" && route.length === 3) html = await channelPage(route[1], route[2]);
    else if (route[0] === "topics" && route.length === 2) html = await topicPage(route[1]);
    else if (route[0] === "nodes" && route.length === 2) html = await nodePage(route[1]);
    else if (route[0] === "nodes") html = await nodesPage();
    else if (route[0] === "lookup") html = await lookupPage();
    else if (route[0] === "counter") html = await counterPage();
    else html = await topicsPage();
    // Nothing changed since the last draw: keep the page as it is (a selection, a hover).
    if (html === drawn) return;
    drawn = html;
    // Keep what is typed in the form, and the field that has the focus: redraw the rest.
    const form = document.getElementById("create");
    const focused = form && form.contains(document.activeElement) ? document.activeElement.name : null;
    if (form) { said.topic = form.topic.value; said.channel = form.channel.value; }
    // Graphite's images are drawn once per page, not at every 2 s redraw: keep the old ones.
    const kept = {};
    main.querySelectorAll("img[id^='graphite-']").forEach(img => { kept[img.id] = img; });
    main.innerHTML = html;
    main.querySelectorAll("img[id^='graphite-']").forEach(img => {
      const old = kept[img.id];
      if (old && old.getAttribute("src") === img.getAttribute("src")) img.replaceWith(old);
    });
    const f0 = document.getElementById("create");
    if (f0) {
      f0.topic.value = said.topic; f0.channel.value = said.channel;
      if (focused) (f0.elements[focused] || f0.topic).focus();
    }
    showSaid();
    main.querySelectorAll("button[data-action]").forEach(b =>
      b.addEventListener("click", () => act(route.slice(1).join("/"), b.dataset.action)));
    main.querySelectorAll("button[data-tombstone]").forEach(b =>
      b.addEventListener("click", () => tombstone(b.dataset.node, b.dataset.tombstone)));
    const f = document.getElementById("create");
    if (f) f.addEventListener("submit", e => { e.preventDefault(); create(f); });
  } catch (e) {
    main.textContent = e.message;
    drawn = null;
  }
}
render();
setInterval(render, 2000);
