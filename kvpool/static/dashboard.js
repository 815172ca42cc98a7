// kvpool live dashboard: polls /api/stats and /api/history once a second and draws plain SVG. No dependencies,
// so the page works on an offline cluster. Every value shown is computed from the integers of /api/stats
// (hit rate = sum of hit_tokens_by_tier / requested_tokens), so it matches `kvpool stats` exactly.
"use strict";

const REFRESH_MS = 1000;
const HISTORY_POINTS = 300;
const TIERS = ["hbm", "dram", "ssd"];
const COLORS = { all: "#e6edf3", hbm: "#c084fc", dram: "#4cc2ff", ssd: "#f5a524",
                 requested: "#8b98a8", hit: "#3fb950" };
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

function pct(num, den) {
  if (!den) return "\u2014";
  return (100 * num / den).toFixed(1) + "%";
}

function fmtInt(n) {
  return Math.round(n).toLocaleString("en-US");
}

function fmtCompact(n) {
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
  if (a >= 100 || Number.isInteger(n)) return fmtInt(n);
  return String(Number(n.toPrecision(2)));  // 0.25 stays 0.25 (toFixed(1) would print 0.3)
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i === 0 ? String(n) : n.toFixed(1)) + " " + units[i];
}

function fmtTime(t) {
  const d = new Date(t * 1000);
  return d.toTimeString().slice(0, 8);
}

// Seconds as the "Prefill time saved" card shows them (tests/kvpool/test_dashboard.py mirrors it).
function fmtSeconds(s) {
  if (s < 100) return `${s.toFixed(2)} s`;
  if (s < 6000) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function sumValues(obj) {
  return Object.values(obj || {}).reduce((a, b) => a + b, 0);
}

// Counters that are an int in one pool version and {tier: int} in another.
function total(x) {
  return typeof x === "number" ? x : sumValues(x);
}

// ---- summary cards ---------------------------------------------------------------------------------------------
function renderCards(s, lastPoint) {
  const req = s.requested_tokens, hit = sumValues(s.hit_tokens_by_tier);
  $("hit-rate-value").textContent = pct(hit, req);
  $("hit-rate-value").dataset.hitTokens = hit;
  $("hit-rate-value").dataset.requestedTokens = req;
  $("hit-rate-detail").textContent = req ? `${fmtInt(hit)} of ${fmtInt(req)} tokens served from the pool`
                                         : "no tokens requested yet";
  const chips = $("hit-rate-tiers");
  chips.replaceChildren();
  for (const tier of s.active_tiers) {
    const chip = el("span", { class: "chip", id: `hit-rate-${tier}`, "data-tier": tier });
    chip.append(el("span", { class: "dot", style: `background:${COLORS[tier]}` }),
                `${tier.toUpperCase()} ${pct(s.hit_tokens_by_tier[tier], req)}`);
    chips.append(chip);
  }
  const saved = s.prefill_seconds_saved || 0;
  $("seconds-saved").textContent = fmtSeconds(saved);
  $("seconds-saved").dataset.seconds = saved;
  $("pinned").textContent = `pinned ${fmtInt(s.pinned_objects || 0)} objects (${fmtBytes(s.pinned_bytes || 0)})` +
    ` \u00b7 ${fmtInt(s.pins_clipped || 0)} clipped \u00b7 ${fmtInt(s.pinned_evictions || 0)} yielded`;
  $("requested-tokens").textContent = fmtInt(req);
  $("lookups").textContent = `${fmtInt(s.lookups)} lookups \u00b7 ` +
                             `${fmtInt(s.hit_keys || 0)} of ${fmtInt(s.requested_keys || 0)} blocks hit`;
  if (lastPoint) {
    $("throughput-value").textContent = `${fmtCompact(lastPoint.requested_tokens_per_s)} tok/s`;
    $("throughput-detail").textContent =
      `hit ${fmtCompact(lastPoint.hit_tokens_per_s)} tok/s \u00b7 ${fmtCompact(lastPoint.lookups_per_s)} lookups/s` +
      ("puts" in s ? ` \u00b7 ${fmtCompact(lastPoint.stored_per_s)} blocks stored/s` : "");
  } else {
    $("throughput-value").textContent = "\u2014";
    $("throughput-detail").textContent = "waiting for a second sample";
  }
  let objects = 0, used = 0, cap = 0;
  for (const tiers of Object.values(s.nodes)) {
    for (const t of Object.values(tiers)) { objects += t.objects; used += t.bytes; cap += t.capacity; }
  }
  $("objects-value").textContent = fmtInt(objects);
  $("pool-used").textContent = `${fmtBytes(used)} of ${fmtBytes(cap)} (${pct(used, cap)})`;
  $("evictions").textContent = fmtInt(total(s.evictions || 0));
  $("demotions").textContent = fmtInt(total(s.demotions || 0));
  $("promotions").textContent = fmtInt(total(s.promotions || 0));
  $("ssd-corrupt").textContent = fmtInt(s.ssd_corrupt || 0);
  $("tombstones").textContent = fmtInt(s.tombstones || 0) +
    (s.tombstones_folded ? ` (+${fmtInt(s.tombstones_folded)} folded)` : "");
  $("records-refused").textContent = fmtInt(s.records_refused || 0);
  $("nodes-alive").textContent = fmtInt(s.nodes_alive);
}

// ---- line charts -----------------------------------------------------------------------------------------------
// series: [{name, color, points: [[t, value|null], ...]}]; a null value breaks the line (no data in that window).
function drawLineChart(svg, series, opts) {
  const W = Math.max(svg.clientWidth || 640, 200), H = Math.max(svg.clientHeight || 240, 120);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.removeAttribute("preserveAspectRatio");
  svg.replaceChildren();
  const m = { l: 58, r: 12, t: 10, b: 24 };
  const pw = W - m.l - m.r, ph = H - m.t - m.b;
  const all = series.flatMap((s) => s.points);
  const ts = all.map((p) => p[0]);
  const vals = all.map((p) => p[1]).filter((v) => v !== null && v !== undefined);
  let yMax = opts.yMax;
  if (yMax === undefined) yMax = niceCeil(Math.max(1, ...vals));
  for (let i = 0; i <= 4; i++) {
    const y = m.t + ph - (i / 4) * ph;
    svg.append(el("svg:line", { class: "gridline", x1: m.l, x2: W - m.r, y1: y, y2: y }));
    svg.append(el("svg:text", { class: "axis-label", x: m.l - 8, y: y + 4, "text-anchor": "end" },
                  opts.yFormat((i / 4) * yMax)));
  }
  if (!ts.length) {
    svg.append(el("svg:text", { class: "no-data", x: m.l + pw / 2, y: m.t + ph / 2, "text-anchor": "middle" },
                  "collecting samples\u2026"));
    return;
  }
  const t0 = Math.min(...ts), t1 = Math.max(...ts, t0 + 1);
  const x = (t) => m.l + ((t - t0) / (t1 - t0)) * pw;
  const y = (v) => m.t + ph - (Math.min(v, yMax) / yMax) * ph;
  let lastLabel = "";
  for (let i = 0; i <= 3; i++) {
    const t = t0 + (i / 3) * (t1 - t0);
    const anchor = i === 0 ? "start" : i === 3 ? "end" : "middle";
    const label = fmtTime(t);
    if (label === lastLabel) continue;  // a range of a few seconds: one label per second, not three equal ones
    lastLabel = label;
    svg.append(el("svg:text", { class: "axis-label", x: x(t), y: H - 6, "text-anchor": anchor }, label));
  }
  for (const s of series) {
    let d = "", pen = false;
    const pts = s.points;
    for (let i = 0; i < pts.length; i++) {
      const [t, v] = pts[i];
      if (v === null || v === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      const next = pts[i + 1];
      if (!pen && (!next || next[1] === null || next[1] === undefined)) {
        // An isolated sample (first point, or between gaps) has no segment to draw: mark it with a dot.
        svg.append(el("svg:circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 3, fill: s.color,
                                      "data-series": s.name }));
      }
      pen = true;
    }
    if (d) svg.append(el("svg:path", { class: "series", d, stroke: s.color, "data-series": s.name }));
  }
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const k of [1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8, 10]) if (v <= k * p) return k * p;
  return 10 * p;
}

function renderLegend(node, series) {
  node.replaceChildren();
  for (const s of series) {
    const item = el("span", { "data-series": s.name });
    item.append(el("span", { class: "swatch", style: `background:${s.color}` }), s.label || s.name);
    node.append(item);
  }
}

function renderCharts(points) {
  const tiers = TIERS.filter((t) => points.some((p) => t in p.hit_rate));
  const hitSeries = [{ name: "all", label: "all tiers", color: COLORS.all,
                       points: points.map((p) => [p.t, p.hit_rate.all === null ? null : 100 * p.hit_rate.all]) }];
  for (const t of tiers) {
    hitSeries.push({ name: t, label: t.toUpperCase(), color: COLORS[t],
                     points: points.map((p) => [p.t, p.hit_rate[t] == null ? null : 100 * p.hit_rate[t]]) });
  }
  drawLineChart($("hit-rate-chart"), hitSeries, { yMax: 100, yFormat: (v) => v.toFixed(0) + "%" });
  renderLegend($("hit-rate-legend"), hitSeries);
  const tputSeries = [
    { name: "requested", label: "requested tokens/s", color: COLORS.requested,
      points: points.map((p) => [p.t, p.requested_tokens_per_s]) },
    { name: "hit", label: "hit tokens/s", color: COLORS.hit, points: points.map((p) => [p.t, p.hit_tokens_per_s]) },
  ];
  drawLineChart($("throughput-chart"), tputSeries, { yFormat: fmtCompact });
  renderLegend($("throughput-legend"), tputSeries);
}

// ---- capacity bars ---------------------------------------------------------------------------------------------
function renderCapacity(s) {
  const box = $("capacity");
  const nodes = Object.keys(s.nodes).sort();
  if (!nodes.length) {
    box.replaceChildren(el("div", { class: "empty" }, "no storage nodes registered"));
    return;
  }
  const frag = document.createDocumentFragment();
  for (const node of nodes) {
    const group = el("div", { class: "cap-node", "data-node": node });
    group.append(el("div", { class: "cap-node-name" }, node));
    for (const tier of TIERS) {
      const u = s.nodes[node][tier];
      if (!u) continue;
      const frac = u.capacity ? u.bytes / u.capacity : 0;
      const row = el("div", { class: "cap-row cap-bar", "data-node": node, "data-tier": tier,
                              "data-used": u.bytes, "data-capacity": u.capacity, "data-objects": u.objects });
      const track = el("div", { class: "cap-track" });
      track.append(el("div", { class: "cap-fill",
                               style: `width:${(100 * Math.min(frac, 1)).toFixed(2)}%;background:${COLORS[tier]}` }));
      row.append(el("span", { class: "cap-tier", style: `color:${COLORS[tier]}` }, tier),
                 track,
                 el("span", { class: "cap-text" },
                    `${fmtBytes(u.bytes)} / ${fmtBytes(u.capacity)} \u00b7 ${pct(u.bytes, u.capacity)}` +
                    ` \u00b7 ${fmtInt(u.objects)} obj`));
      group.append(row);
    }
    frag.append(group);
  }
  box.replaceChildren(frag);
}

// ---- namespaces table ------------------------------------------------------------------------------------------
function renderNamespaces(s) {
  const body = $("namespaces").tBodies[0];
  const rows = Object.entries(s.namespaces)
    .sort((a, b) => b[1].requested_tokens - a[1].requested_tokens || (a[0] < b[0] ? -1 : 1))
    .slice(0, 10);
  if (!rows.length) {
    const tr = el("tr", { class: "empty-row" });
    tr.append(el("td", { colspan: 4, class: "empty" }, "no lookups yet"));
    body.replaceChildren(tr);
    return;
  }
  const frag = document.createDocumentFragment();
  for (const [name, c] of rows) {
    const hit = sumValues(c.hit_tokens_by_tier);
    const tr = el("tr", { class: "ns-row", "data-namespace": name });
    tr.append(el("td", { class: "ns-name" }, name), el("td", { class: "num" }, fmtInt(c.requested_tokens)),
              el("td", { class: "num" }, fmtInt(hit)));
    const cell = el("div", { class: "rate-cell" });
    const bar = el("div", { class: "rate-bar" });
    for (const tier of TIERS) {
      const n = (c.hit_tokens_by_tier || {})[tier];
      if (!n || !c.requested_tokens) continue;
      bar.append(el("span", { style: `width:${(100 * n / c.requested_tokens).toFixed(2)}%;` +
                                     `background:${COLORS[tier]}`, title: tier }));
    }
    cell.append(bar, el("span", { class: "rate-text ns-hit-rate" }, pct(hit, c.requested_tokens)));
    const td = el("td");
    td.append(cell);
    tr.append(td);
    frag.append(tr);
  }
  body.replaceChildren(frag);
}

function renderTenants(s) {
  // Present only with authentication on or quotas configured (store/stats.py "tenants").
  const tenants = s.tenants || {};
  const names = Object.keys(tenants).sort();
  $("tenants-panel").hidden = !names.length;
  const frag = document.createDocumentFragment();
  const ofQuota = (used, quota) => quota ? `${fmtBytes(used)} / ${fmtBytes(quota)} (${pct(used, quota)})`
                                         : `${fmtBytes(used)} / —`;
  for (const name of names) {
    const t = tenants[name];
    const tr = el("tr", { class: "tenant-row", "data-tenant": name });
    tr.append(el("td", { class: "tenant-name" }, name), el("td", { class: "num" }, fmtInt(t.objects)),
              el("td", { class: "num tenant-dram" }, ofQuota((t.bytes_by_tier || {}).dram || 0, t.quota.dram_bytes)),
              el("td", { class: "num tenant-total" }, ofQuota(t.bytes, t.quota.total_bytes)),
              el("td", { class: "num" }, fmtInt(t.quota_evictions)), el("td", { class: "num" }, fmtInt(t.no_space)),
              el("td", { class: "num tenant-hit-rate" }, pct(t.hit_tokens, t.requested_tokens)));
    frag.append(tr);
  }
  $("tenants").tBodies[0].replaceChildren(frag);
}

// ---- polling ---------------------------------------------------------------------------------------------------
let updates = 0;

function setStatus(state, text) {
  const pill = $("conn-status");
  pill.className = "pill " + ({ live: "pill-live", down: "pill-down" }[state] || "pill-wait");
  pill.dataset.state = state;
  pill.textContent = text;
}

async function fetchJson(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

async function refresh() {
  try {
    const [stats, history] = await Promise.all([fetchJson("/api/stats"),
                                                fetchJson(`/api/history?limit=${HISTORY_POINTS}`)]);
    const points = history.points;
    $("hit-window-note").textContent = history.interval
      ? `rates over ${(history.interval * history.window).toFixed(0)} s windows`
      : `rates over ${history.window}-sample windows`;
    renderCards(stats, points.length ? points[points.length - 1] : null);
    renderCharts(points);
    renderCapacity(stats);
    renderNamespaces(stats);
    renderTenants(stats);
    updates += 1;
    document.body.dataset.updates = String(updates);
    setStatus("live", "live");
    // The sample time (server clock), not the browser's: what the numbers are as of.
    $("updated-at").textContent = fmtTime(points.length ? points[points.length - 1].t : Date.now() / 1000);
  } catch (err) {
    setStatus("down", "pool unreachable");
    console.warn("kvpool dashboard:", err);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
