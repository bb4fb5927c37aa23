// nsqadmin's pages: one small app over the JSON API. It polls every 2 s and keeps the last
// five minutes of samples in memory to draw the charts (no Graphite needed).
"use strict";
const BASE = document.body.dataset.base || "";
const route = location.pathname.slice(BASE.length).replace(/^\/+|\/+$/g, "").split("/");
const main = document.getElementById("main");
const errorsEl = document.getElementById("errors");
const history = [];  // {t, depth, count}
const KEEP_MS = 5 * 60 * 1000;

function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])); }
function link(path, text) { return `<a href="${BASE}/${path}">${esc(text)}</a>`; }
async function api(path, init) {
  const r = await fetch(`${BASE}/api/${path}`, init);
  const body = r.status === 200 && (init || {}).method ? null : await r.json().catch(() => null);
  if (r.status !== 200) throw new Error((body && body.message) || `HTTP ${r.status}`);
  return body;
}

function chart(id, label, values) {
  const w = 320, h = 80, max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${(i * w / Math.max(1, values.length - 1)).toFixed(1)},${(h - v * (h - 4) / max - 2).toFixed(1)}`).join(" ");
  return `<figure><figcaption>${esc(label)}: <span data-last="${id}">${values.length ? values[values.length - 1].toFixed(0) : 0}</span></figcaption>` +
    `<svg class="chart" id="${id}" data-points="${values.length}" width="${w}" height="${h}"><polyline fill="none" stroke="#2a7ae2" stroke-width="2" points="${pts}"/></svg></figure>`;
}

function record(depth, count) {
  const now = Date.now();
  history.push({t: now, depth, count});
  while (history.length && history[0].t < now - KEEP_MS) history.shift();
  const rates = [];
  for (let i = 1; i < history.length; i++) {
    const dt = (history[i].t - history[i - 1].t) / 1000;
    rates.push(dt > 0 ? Math.max(0, (history[i].count - history[i - 1].count) / dt) : 0);
  }
  return chart("depth-chart", "depth", history.map(s => s.depth)) + chart("rate-chart", "messages/s", rates);
}

function buttons(paused) {
  return ["pause", "unpause", "empty", "delete"].filter(a => a !== (paused ? "pause" : "unpause"))
    .map(a => `<button data-action="${a}">${a}</button>`).join("") + `<span id="refused" class="refused"></span>`;
}

async function act(path, action) {
  if (!confirm(`${action} ${decodeURIComponent(path)}?`)) return;
  const init = action === "delete" ? {method: "DELETE"} :
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({action})};
  try {
    await api(`topics/${path}`, init);
    if (action === "delete") location.href = `${BASE}/topics`; else render();
  } catch (e) {
    document.getElementById("refused").textContent = `refused: ${e.message}`;
  }
}

async function tombstone(node, topic) {
  if (!confirm(`tombstone topic ${topic} on node ${node}?`)) return;
  try {
    await api(`nodes/${node}`, {method: "DELETE", headers: {"Content-Type": "application/json"}, body: JSON.stringify({topic})});
    render();
  } catch (e) {
    document.getElementById("refused").textContent = `refused: ${e.message}`;
  }
}

const COLS = ["depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count", "message_count"];

async function render() {
  try {
    let html = "";
    if (route[0] === "topics" && route.length === 3) {
      const [t, c] = [route[1], route[2]];
      const d = await api(`topics/${t}/${c}`);
      html = `<h1>${link(`topics/${t}`, t)} / ${esc(c)}${d.paused ? ' <span class="paused">paused</span>' : ""}</h1>` +
        buttons(d.paused) + record(d.depth, d.message_count) +
        `<table id="nodes"><tr><th>node</th>${COLS.map(k => `<th>${k}</th>`).join("")}</tr>` +
        d.nodes.map(n => `<tr><td>${esc(n.node)}</td>${COLS.map(k => `<td>${n[k]}</td>`).join("")}</tr>`).join("") + "</table>" +
        `<h2>end-to-end latency</h2><table id="e2e"><tr><th>node</th><th>count</th><th>percentiles (ms)</th></tr>` +
        d.nodes.map(n => `<tr><td>${esc(n.node)}</td><td>${n.e2e ? n.e2e.count : 0}</td><td>${n.e2e && n.e2e.percentiles ? n.e2e.percentiles.map(p => `p${p.quantile * 100}: ${(p.value / 1e6).toFixed(1)}`).join(", ") : ""}</td></tr>`).join("") + "</table>" +
        (d.nodes.some(n => n.lifecycle) ? `<h2>lifecycle</h2><table id="lifecycle"><tr><th>node</th><th>dead-lettered</th><th>expired</th><th>dropped</th><th>max attempts</th><th>ttl</th><th>max depth</th></tr>` +
          d.nodes.filter(n => n.lifecycle).map(n => `<tr><td>${esc(n.node)}</td><td>${n.lifecycle.dead_letter_count}</td><td>${n.lifecycle.expired_count}</td><td>${n.lifecycle.dropped_count}</td><td>${n.lifecycle.max_attempts}</td><td>${esc(n.lifecycle.msg_ttl)}</td><td>${n.lifecycle.max_depth}</td></tr>`).join("") + "</table>" : "") +
        `<h2>clients</h2><table id="clients"><tr><th>client</th><th>node</th><th>user agent</th><th>in flight</th><th>ready</th><th>finished</th><th>requeued</th><th>tls</th><th>snappy</th><th>deflate</th></tr>` +
        d.clients.map(k => `<tr><td>${esc(k.hostname)}:${esc(k.client_id)}</td><td>${esc(k.node)}</td><td>${esc(k.user_agent)}</td><td>${k.in_flight_count}</td><td>${k.ready_count}</td><td>${k.finish_count}</td><td>${k.requeue_count}</td><td>${k.tls}</td><td>${k.snappy}</td><td>${k.deflate}</td></tr>`).join("") + "</table>";
      errorsEl.textContent = d.errors.join("; ");
    } else if (route[0] === "topics" && route.length === 2) {
      const t = route[1];
      const d = await api(`topics/${t}`);
      // The chart shows the whole backlog: the topic's own depth plus its channels'.
      const backlog = d.depth + d.channels.reduce((a, c) => a + c.depth, 0);
      html = `<h1>${esc(t)}${d.paused ? ' <span class="paused">paused</span>' : ""}</h1>` + buttons(d.paused) +
        record(backlog, d.message_count) +
        `<table id="channels"><tr><th>channel</th>${COLS.map(k => `<th>${k}</th>`).join("")}<th>clients</th></tr>` +
        d.channels.map(c => `<tr><td>${link(`topics/${t}/${c.channel}`, c.channel)}${c.paused ? ' <span class="paused">paused</span>' : ""}</td>${COLS.map(k => `<td>${c[k]}</td>`).join("")}<td>${c.clients}</td></tr>`).join("") + "</table>" +
        `<h2>nodes</h2><table id="nodes"><tr><th>node</th><th>depth</th><th>message_count</th><th>log offsets</th></tr>` +
        d.nodes.map(n => `<tr><td>${esc(n.node)}</td><td>${n.depth}</td><td>${n.message_count}</td><td>${n.log ? `${n.log.earliest_offset}–${n.log.latest_offset}` : ""}</td></tr>`).join("") + "</table>" +
        ((d.partitions || []).length ? `<h2>replicated partitions</h2><table id="partitions"><tr><th>partition (origin node id)</th><th>leader</th><th>epoch</th><th>in sync</th><th>replicas</th><th>committed offset</th><th>follower lag (records)</th></tr>` +
          d.partitions.map(p => `<tr><td>${p.partition}</td><td>${esc(p.node)} (id ${p.leader})</td><td>${p.epoch}</td><td>${esc(p.isr.join(", "))}</td><td>${esc(p.replicas.join(", "))}</td><td>${p.committed}</td><td>${esc(Object.entries(p.follower_lag).map(([f, l]) => `${f}: ${l}`).join(", "))}</td></tr>`).join("") + "</table>" : "");
      errorsEl.textContent = d.errors.join("; ");
    } else if (route[0] === "lookup") {
      const d = await api("lookup");
      html = "<h1>nsqlookupd</h1>" + d.lookupds.map(l =>
        `<h2>${esc(l.lookupd)}</h2><table class="lookup"><tr><th>node</th><th>version</th><th>topics</th></tr>` +
        l.producers.map(p => `<tr><td>${esc(p.node)}</td><td>${esc(p.version)}</td><td>` +
          p.topics.map(t => t.tombstoned ? `<s>${esc(t.topic)}</s> (tombstoned)` :
            `${esc(t.topic)} <button data-tombstone="${esc(t.topic)}" data-node="${esc(p.node)}">tombstone</button>`).join(", ") +
          "</td></tr>").join("") + "</table>").join("") + '<span id="refused" class="refused"></span>';
      errorsEl.textContent = d.errors.join("; ");
    } else if (route[0] === "nodes") {
      const d = await api("nodes");
      html = `<h1>Nodes</h1><table id="nodes"><tr><th>node</th><th>version</th><th>health</th><th>topics</th></tr>` +
        d.nodes.map(n => `<tr><td>${esc(n.node)}</td><td>${esc(n.version)}</td><td>${esc(n.health)}</td><td>${n.topics}</td></tr>`).join("") + "</table>";
      errorsEl.textContent = d.errors.join("; ");
    } else if (route[0] === "counter") {
      const d = await api("topics");
      const total = d.topics.reduce((a, t) => a + t.message_count, 0);
      html = `<h1>Messages</h1><div class="counter" id="counter">${total}</div>` + record(0, total);
    } else {
      const d = await api("topics");
      html = `<h1>Topics</h1><table id="topics"><tr><th>topic</th><th>depth</th><th>message_count</th><th>channels</th><th>nodes</th></tr>` +
        d.topics.map(t => `<tr><td>${link(`topics/${t.topic}`, t.topic)}${t.paused ? ' <span class="paused">paused</span>' : ""}</td><td>${t.depth}</td><td>${t.message_count}</td><td>${t.channels}</td><td>${t.nodes.length}</td></tr>`).join("") + "</table>";
      errorsEl.textContent = d.errors.join("; ");
    }
    main.innerHTML = html;
    main.querySelectorAll("button[data-action]").forEach(b =>
      b.addEventListener("click", () => act(route.slice(1).join("/"), b.dataset.action)));
    main.querySelectorAll("button[data-tombstone]").forEach(b =>
      b.addEventListener("click", () => tombstone(b.dataset.node, b.dataset.tombstone)));
  } catch (e) {
    main.textContent = e.message;
  }
}

render();
setInterval(render, 2000);
