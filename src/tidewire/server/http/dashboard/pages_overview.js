// Overview (health, uptime, throughput, connections, storage), metrics charts over the last
// hour, and the settings in effect.

import { can, get } from "./api.js";
import { lineChart } from "./chart.js";
import { clear, put, fmtBytes, fmtDuration, fmtNum, h, note, table } from "./ui.js";

const REFRESH_MS = 5000;

const SERIES = [
  ["messages_in_per_s", "Messages in /s", fmtNum],
  ["bytes_in_per_s", "Bytes in /s", fmtBytes],
  ["bytes_out_per_s", "Bytes out /s", fmtBytes],
  ["requests_per_s", "Requests /s", fmtNum],
  ["connections", "Connections", fmtNum],
  ["disk_used_bytes", "Disk used", fmtBytes],
];

async function settle(promise) {
  try { return { ok: true, value: await promise }; } catch (e) { return { ok: false, error: e }; }
}

function stat(label, value, cls) {
  return h("div", { class: "card stat" }, h("div", { class: "label" }, label),
    h("div", { class: `value ${cls || ""}` }, value));
}

function latest(recent, name) {
  const s = recent && recent.series && recent.series[name];
  return s && s.length ? s[s.length - 1][1] : null;
}

async function uptimeSeconds(recent) {
  if (recent && typeof recent.uptime_s === "number") return recent.uptime_s;
  if (!can("describe_cluster")) return null;
  const r = await settle(get("/metrics", { accept: "text/plain", raw: true }));
  if (!r.ok) return null;
  const text = await r.value.text();
  const up = /^tidewire_uptime_seconds\s+(\S+)/m.exec(text);
  if (up) return Number(up[1]);
  const m = /^process_start_time_seconds\s+(\S+)/m.exec(text);
  return m ? Date.now() / 1000 - Number(m[1]) : null;
}

function problems(results) {
  return results.filter(([, r]) => !r.ok)
    .map(([what, r]) => note("error", `${what}: ${r.error.message} (${r.error.status || "no answer"})`));
}

export async function overviewPage(main) {
  const body = h("div");
  main.append(h("h1", {}, "Overview"), body);
  let timer = null;
  const draw = async () => {
    const cluster = (path) => (can("describe_cluster") ? settle(get(path))
      : { ok: false, error: { status: 403, message: "no permission to describe the cluster" } });
    const [live, ready, startup, storage, recovery, listeners, recent, topics, groups] =
      await Promise.all([
      settle(get("/healthz/live")), settle(get("/healthz/ready")),
      settle(get("/healthz/startup")), cluster("/healthz/storage"),
      cluster("/healthz/recovery"), cluster("/healthz/listeners"),
      settle(get("/v1/metrics/recent")), settle(get("/v1/topics?limit=1")),
      settle(get("/v1/groups?limit=1")),
    ]);
    const rec = recent.ok ? recent.value : null;
    const up = await uptimeSeconds(rec);
    const health = (r) => (r.ok ? r.value.status : (r.error.status === 503 ? "not ready" : "down"));
    const cls = (r) => (r.ok && r.value.status === "ok" ? "ok" : "bad");
    const count = (r, key) => (r.ok ? (r.value.total ?? r.value[key].length) : "–");
    put(body, 
      h("div", { class: "cards", id: "health" },
        stat("Live", health(live), cls(live)),
        stat("Ready", health(ready), cls(ready)),
        stat("Started", health(startup), cls(startup)),
        stat("Storage", storage.ok ? storage.value.status : "unknown",
          storage.ok ? (storage.value.status === "ok" ? "ok" : "warn") : "muted"),
        stat("Uptime", up === null ? "unknown" : fmtDuration(up)),
        stat("Topics", count(topics, "topics")),
        stat("Consumer groups", count(groups, "groups")),
        stat("Connections", fmtNum(latest(rec, "connections"))),
        stat("Disk used", fmtBytes(latest(rec, "disk_used_bytes"))),
        recovery.ok ? stat("Last start", {
          new: "new data directory", clean: "after a clean stop", unclean: "logs scanned",
        }[recovery.value.last_start] || recovery.value.last_start,
        recovery.value.status === "ok" ? "ok" : "warn")
          : null,
        recovery.ok ? stat("Partitions open", `${fmtNum(recovery.value.partitions)}` +
          (recovery.value.offline ? ` (${recovery.value.offline} offline)` : "")) : null),
      listeners.ok && listeners.value.listeners.length ? h("p", { class: "muted", id: "listeners" },
        "Listening: ", listeners.value.listeners.map((l) =>
          `${l.name} ${l.host}:${l.port}${l.tls ? " (TLS)" : ""}`).join(" · ")) : null,
      problems([
        ...(can("describe_cluster") ? [["Storage health (GET /healthz/storage)", storage],
          ["Recovery (GET /healthz/recovery)", recovery],
          ["Listeners (GET /healthz/listeners)", listeners]] : []),
        ["Recent metrics (GET /v1/metrics/recent)", recent],
        ["Topics (GET /v1/topics)", topics], ["Groups (GET /v1/groups)", groups]]),
      storage.ok && storage.value.problems.length
        ? [h("h2", {}, "Storage problems"), table([
          { title: "Topic", cell: (p) => p.topic }, { title: "Partition", num: 1, cell: (p) => p.partition },
          { title: "Kind", cell: (p) => p.kind }, { title: "Range", cell: (p) => `${p.start}–${p.end}` },
          { title: "Reason", cell: (p) => p.reason }], storage.value.problems)] : null,
      rec ? [h("h2", {}, "Throughput"), h("div", { class: "charts" },
        SERIES.slice(0, 4).map(([k, t, f]) => lineChart(t, rec.series[k] || [], f)))] : null);
    timer = setTimeout(draw, REFRESH_MS);
  };
  await draw();
  return () => clearTimeout(timer);
}

export async function metricsPage(main) {
  const body = h("div");
  main.append(h("h1", {}, "Metrics"),
    h("p", { class: "muted" }, "The last hour from the broker's own recent-samples ring " +
      "(GET /v1/metrics/recent); Prometheus scrapes /metrics."), body);
  let timer = null;
  const draw = async () => {
    const rec = await get("/v1/metrics/recent");
    const lag = Object.entries(rec.group_lag || {});
    put(body, 
      h("div", { class: "charts", id: "charts" },
        SERIES.map(([k, t, f]) => lineChart(t, (rec.series || {})[k] || [], f))),
      lag.length ? [h("h2", {}, "Consumer lag"), h("div", { class: "charts" },
        lag.map(([g, pts]) => lineChart(`Lag of ${g}`, pts, fmtNum)))] : null,
      h("p", { class: "muted" }, `One sample every ${rec.interval_s} s.`));
    timer = setTimeout(draw, REFRESH_MS);
  };
  await draw();
  return () => clearTimeout(timer);
}

function shown(v) {
  return v === null || v === undefined ? "–" : String(v);
}

export async function settingsPage(main) {
  const filter = h("input", { placeholder: "name, value or origin", id: "settings-filter" });
  const changed = h("input", { type: "checkbox", id: "settings-changed" });
  const body = h("div");
  main.append(h("h1", {}, "Settings in effect"),
    h("div", { class: "toolbar" }, h("label", {}, "Filter", filter),
      h("label", {}, "Only those not at their default", changed)), body);
  const doc = await get("/v1/settings");
  const draw = () => {
    const q = filter.value.toLowerCase();
    const rows = (doc.settings || []).filter((r) =>
      (!changed.checked || r.origin !== "default") &&
      (!q || [r.section, r.key, shown(r.value), r.origin].join(" ").toLowerCase().includes(q)));
    put(body,
      (doc.warnings || []).map((w) => note("error", w)),
      doc.recorded === false ? note("error", "This broker did not record its settings.") : null,
      table([
        { title: "Section", cell: (r) => r.section },
        { title: "Setting", cell: (r) => h("span", { title: r.help || "" }, r.key) },
        { title: "Value", cls: "val", cell: (r) => shown(r.value) },
        { title: "Default", cls: "val", cell: (r) => shown(r.default) },
        { title: "From", cell: (r) => r.origin },
      ], rows, { attrs: { id: "settings" }, empty: "no setting matches" }));
  };
  filter.addEventListener("input", draw);
  changed.addEventListener("change", draw);
  draw();
}
