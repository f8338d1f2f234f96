// The Kafka listener: where it listens, its connections and bytes, and per API the requests
// (with a rate over the last refresh), the errors by Kafka's error name, the versions asked
// for and the latency; SASL exchanges by mechanism. The figures are GET /v1/stats/kafka (the
// same ones /metrics exports as tidewire_kafka_*), refreshed every few seconds; the rates are
// the difference between two refreshes.

import { get } from "./api.js";
import { fmtBytes, fmtNum, h, note, put, table } from "./ui.js";
import { refusal } from "./pages_topics.js";

const REFRESH_MS = 2000;

const CARDS = [
  ["connections", "Connections open", fmtNum],
  ["accepted", "Connections accepted", fmtNum],
  ["requests", "Requests", fmtNum],
  ["errors", "Errors", fmtNum],
  ["received_bytes", "Received", fmtBytes],
  ["sent_bytes", "Sent", fmtBytes],
];

const idOf = (field) => `kafka-${field.replaceAll("_", "-")}`;
const fmtMs = (ms) => (ms === null || ms === undefined ? "–" : `${fmtNum(ms)} ms`);
// "name: count, ..." with the largest first; `prefix` before each name (v for versions).
const pairs = (obj, prefix = "") => Object.entries(obj || {}).sort((a, b) => b[1] - a[1])
  .map(([k, n]) => `${prefix}${k}: ${fmtNum(n)}`).join(", ") || "–";

function stat(label, value, id) {
  return h("div", { class: "card stat" }, h("div", { class: "label" }, label),
    h("div", { class: "value", id }, value));
}

export async function kafkaPage(main) {
  const listener = h("div", { id: "kafka-listener" });
  const cards = h("div", { id: "kafka-totals" });
  const apis = h("div", { id: "kafka-apis" });
  const auth = h("div", { id: "kafka-auth" });
  main.append(h("h1", {}, "Kafka"), listener, cards, h("h2", {}, "Requests by API"), apis,
    h("h2", {}, "SASL authentication"), auth,
    h("p", { class: "muted" }, `Counts since the broker started, refreshed every ` +
      `${REFRESH_MS / 1000} s; a rate is the change between two refreshes. Latency: from a ` +
      `request's frame read to its answer written (p50 and p99 are bucket upper bounds).`));
  let timer = null;
  let last = null; // { at, counts: {api: requests} } of the previous refresh
  const draw = async () => {
    let s;
    try {
      s = await get("/v1/stats/kafka");
    } catch (e) {
      put(listener, note("error", `The Kafka listener's figures (GET /v1/stats/kafka): ` +
        refusal(e)));
      return;
    }
    const now = performance.now();
    put(listener, s.listening
      ? h("p", { id: "kafka-address", "data-port": s.port },
        "Listening on ", h("b", {}, `${s.host}:${s.port}`), " (Kafka wire protocol).")
      : h("p", { id: "kafka-address", class: "muted", "data-port": "" },
        "The Kafka listener is off (kafka_port is not set)" +
        (s.requests ? "; the counts below are from when it ran." : ".")));
    put(cards, h("div", { class: "cards narrow" },
      CARDS.map(([k, label, f]) => stat(label, f(s[k]), idOf(k)))));
    const rate = (a) => {
      if (!last) return null;
      const dt = (now - last.at) / 1000;
      return dt > 0 ? Math.max(a.requests - (last.counts[a.api] || 0), 0) / dt : null;
    };
    put(apis, table([
      { title: "API", cls: "val", cell: (a) => a.api },
      { title: "Requests", num: 1, cell: (a) => fmtNum(a.requests) },
      { title: "Requests /s", num: 1, cell: (a) => fmtNum(rate(a)) },
      { title: "Errors", num: 1, cell: (a) => fmtNum(a.errors) },
      { title: "Errors by name", cls: "val", cell: (a) => pairs(a.errors_by) },
      { title: "Versions", cls: "val", cell: (a) => pairs(a.versions, "v") },
      { title: "Mean", num: 1, cell: (a) => fmtMs(a.mean_ms) },
      { title: "p50 ≤", num: 1, cell: (a) => fmtMs(a.p50_ms) },
      { title: "p99 ≤", num: 1, cell: (a) => fmtMs(a.p99_ms) },
    ], s.apis, {
      empty: "no Kafka requests yet",
      attrs: { id: "kafka-api-table" },
      rowAttrs: (a) => ({ "data-api": a.api, "data-requests": a.requests,
        "data-errors": a.errors }),
    }));
    put(auth, table([
      { title: "Mechanism", cls: "val", cell: (x) => x.mechanism },
      { title: "Result", cls: "val", cell: (x) => x.result },
      { title: "Exchanges", num: 1, cell: (x) => fmtNum(x.count) },
    ], s.authentications, { empty: "no SASL exchanges", attrs: { id: "kafka-auth-table" } }));
    last = { at: now, counts: Object.fromEntries(s.apis.map((a) => [a.api, a.requests])) };
  };
  const tick = async () => {
    await draw();
    timer = setTimeout(tick, REFRESH_MS);
  };
  await tick();
  return () => clearTimeout(timer);
}
