// The cluster, as the node serving the page sees it: the controller, every node (live or
// gone, with its addresses), the partition counts by state, and the partitions that need
// attention (offline, under min ISR, under-replicated) above the table of every partition,
// with each one's leader, epoch, replicas, ISR, high watermark and lag, and the moves
// (reassignments) in progress: target, replicas added and removed, records left to copy.
// The figures are GET /v1/cluster, GET /v1/cluster/partitions and GET
// /v1/cluster/reassignments (the same ones /metrics exports as tidewire_cluster_*),
// refreshed every few seconds. Above them, the whole cluster's figures from GET
// /v1/cluster/metrics (the node serving the page asks every live node for its own): a row of
// totals, a row per node that answered, and the nodes that did not answer named (their
// figures are in neither). That route waits up to 5 s for a node that does not answer, so
// it is asked alongside the others and drawn when it comes, without holding them back. The
// page is in the navigation only when the broker is a node of a cluster (GET /v1/cluster
// answers).

import { get, getAll } from "./api.js";
import { fmtBytes, fmtNum, h, note, put, table } from "./ui.js";
import { refusal } from "./pages_topics.js";

const REFRESH_MS = 3000;

const CARDS = [
  ["nodes_live", "Nodes live"],
  ["total", "Partitions"],
  ["offline", "Offline"],
  ["under_min_isr", "Under min ISR"],
  ["under_replicated", "Under-replicated"],
  ["led_here", "Led by this node"],
  ["reassigning", "Being moved"],
];

const STATE_CLASS = { online: "ok", under_replicated: "warn", under_min_isr: "bad",
  offline: "bad" };

const ids = (xs) => xs.join(", ");
const lagOf = (p) => {
  const lags = Object.entries(p.follower_lag || {});
  if (lags.length) return lags.map(([n, v]) => `node ${n}: ${fmtNum(v)}`).join(", ");
  return p.lag === null || p.lag === undefined ? "–" : `this node: ${fmtNum(p.lag)}`;
};

function stat(label, value, id, cls = "") {
  return h("div", { class: "card stat" }, h("div", { class: "label" }, label),
    h("div", { class: `value ${cls}`.trim(), id }, value));
}

function partitionTable(rows, id, empty) {
  return table([
    { title: "Topic", cls: "val", cell: (p) => p.topic },
    { title: "Partition", num: 1, cell: (p) => String(p.partition) },
    { title: "State", cell: (p) => h("span", { class: `pill ${STATE_CLASS[p.state]}` },
      p.state.replaceAll("_", " ")) },
    { title: "Leader", num: 1, cell: (p) => (p.leader < 0 ? "none" : String(p.leader)) },
    { title: "Epoch", num: 1, cell: (p) => String(p.leader_epoch) },
    { title: "Replicas", cell: (p) => ids(p.replicas) },
    { title: "ISR", cell: (p) => ids(p.isr) },
    { title: "Min ISR", num: 1, cell: (p) => String(p.min_insync_replicas) },
    { title: "High watermark", num: 1,
      cell: (p) => (p.high_watermark < 0 ? "–" : fmtNum(p.high_watermark)) },
    { title: "Lag (records)", cell: lagOf },
  ], rows, {
    empty,
    attrs: { id },
    rowAttrs: (p) => ({ "data-topic": p.topic, "data-partition": p.partition,
      "data-state": p.state, "data-leader": p.leader, "data-isr": ids(p.isr) }),
  });
}

function movesTable(moves) {
  return table([
    { title: "Topic", cls: "val", cell: (m) => m.topic },
    { title: "Partition", num: 1, cell: (m) => String(m.partition) },
    { title: "Leader", num: 1, cell: (m) => (m.leader < 0 ? "none" : String(m.leader)) },
    { title: "Replicas now", cell: (m) => ids(m.replicas) },
    { title: "ISR", cell: (m) => ids(m.isr) },
    { title: "Target", cell: (m) => ids(m.target) },
    { title: "Adding", cell: (m) => ids(m.adding) || "–" },
    { title: "Removing", cell: (m) => ids(m.removing) || "–" },
    { title: "Left to copy", num: 1,
      cell: (m) => (m.records_left === null ? "known on its leader's node"
        : `${fmtNum(m.records_left)} records, ${fmtBytes(m.bytes_left)}`) },
  ], moves, {
    empty: "none: no partition is being moved",
    attrs: { id: "cluster-moves-table" },
    rowAttrs: (m) => ({ "data-topic": m.topic, "data-partition": m.partition,
      "data-target": ids(m.target), "data-adding": ids(m.adding) }),
  });
}


// The columns of the cluster-wide figures: [field, title, format]; the same fields in the
// totals row and in each node's (GET /v1/cluster/metrics). A rate not known (a node that
// keeps no samples; the totals where none does) is null, shown as "–" (not known, not 0).
const FIGURES = [
  ["messages_in_per_s", "Messages in /s", fmtNum],
  ["bytes_in_per_s", "Bytes in /s", fmtBytes],
  ["bytes_out_per_s", "Bytes out /s", fmtBytes],
  ["messages_in", "Messages in (total)", fmtNum],
  ["messages_out", "Messages out (total)", fmtNum],
  ["disk_used_bytes", "Disk used", fmtBytes],
  ["partitions_led", "Partitions led", fmtNum],
  ["under_replicated_partitions", "Under-replicated", fmtNum],
  ["under_min_isr_partitions", "Under min ISR", fmtNum],
  ["isr_shrinks", "ISR shrinks", fmtNum],
  ["isr_expands", "ISR expands", fmtNum],
];

// The lease cell: a node's lease state now; in the totals, how many nodes' leases are stale.
function lease(row) {
  if (row.kind === "total") {
    const n = row.nodes_lease_stale;
    return h("span", { class: `pill ${n ? "bad" : "ok"}` }, n ? `${n} stale` : "all fresh");
  }
  return h("span", { class: `pill ${row.lease_stale ? "bad" : "ok"}` },
    row.lease_stale ? "stale" : "fresh");
}

// The cluster-wide figures: the totals row first, then each node that answered (the
// answering node first), then a row per node that did not answer, named above the table too.
function figuresTable(doc) {
  const rows = [{ ...doc.totals, kind: "total" },
    ...doc.nodes.map((n) => ({ ...n, kind: "node" })),
    ...doc.missing_nodes.map((id) => ({ node_id: id, kind: "missing" }))];
  const who = (r) => (r.kind === "total" ? h("b", {}, "All nodes")
    : `node ${r.node_id}${r.node_id === doc.node_id ? " (this one)" : ""}`
      + (r.controller ? ", controller" : ""));
  const missing = doc.missing_nodes.length
    ? note("error", `Did not answer within 5 s, left out of the totals: ` +
      `${doc.missing_nodes.map((id) => `node ${id}`).join(", ")}.`)
    : "";
  return [missing, table([
    { title: "Node", cell: who },
    ...FIGURES.map(([key, title, fmt]) => ({ title, num: 1,
      cell: (r) => (r.kind === "missing" ? "–" : fmt(r[key])) })),
    { title: "Lease", cell: (r) => (r.kind === "missing"
      ? h("span", { class: "pill bad" }, "no answer") : lease(r)) },
  ], rows, {
    attrs: { id: "cluster-figures-table" },
    rowAttrs: (r) => ({ "data-node": r.kind === "total" ? "total" : r.node_id,
      "data-kind": r.kind }),
  })];
}

export async function clusterPage(main) {
  const head = h("div", { id: "cluster-head" });
  const cards = h("div", { id: "cluster-totals" });
  const figures = h("div", { id: "cluster-figures" });
  const nodes = h("div", { id: "cluster-nodes" });
  const attention = h("div", { id: "cluster-attention" });
  const moves = h("div", { id: "cluster-moves" });
  const all = h("div", { id: "cluster-all" });
  main.append(h("h1", {}, "Cluster"), head, cards,
    h("h2", {}, "The whole cluster's figures"), figures, h("h2", {}, "Nodes"), nodes,
    h("h2", {}, "Partitions that need attention"), attention,
    h("h2", {}, "Moves in progress"), moves,
    h("h2", {}, "Every partition"), all,
    h("p", { class: "muted" }, `As the node serving this page sees the cluster (its copy ` +
      `of the metadata in etcd), refreshed every ${REFRESH_MS / 1000} s. High watermark and ` +
      `lag are known where this node holds a replica: every follower's lag where it leads, ` +
      `its own where it follows. The whole cluster's figures are every live node's own, ` +
      `asked by this node: the totals are counters since each node started and rates ` +
      `over each node's last 5 s sample.`));
  let timer = null;
  const drawFigures = async (asked) => {
    try {
      put(figures, ...figuresTable(await asked));
    } catch (e) {
      put(figures, note("error",
        `The cluster's figures (GET /v1/cluster/metrics): ${refusal(e)}`));
    }
  };
  const draw = async () => {
    // Asked first, drawn last: a node that does not answer holds it up to 5 s.
    const asked = get("/v1/cluster/metrics");
    asked.catch(() => {}); // handled in drawFigures; not an unhandled rejection meanwhile
    let s;
    let parts;
    let moving;
    try {
      [s, parts, moving] = await getAll("/v1/cluster", "/v1/cluster/partitions",
        "/v1/cluster/reassignments");
    } catch (e) {
      put(head, note("error", `The cluster's status (GET /v1/cluster): ${refusal(e)}`));
      await drawFigures(asked);
      return;
    }
    put(head, h("p", { id: "cluster-id" }, "Cluster ", h("b", {}, s.cluster_id), ", seen from node ",
      h("b", {}, String(s.node_id)), "; controller: ",
      h("b", { id: "cluster-controller" }, s.controller < 0 ? "none" : `node ${s.controller}`),
      s.is_controller ? " (this node)." : "."));
    const counts = { ...s.partitions, nodes_live: s.nodes.filter((n) => n.live).length };
    put(cards, h("div", { class: "cards narrow" }, CARDS.map(([k, label]) => stat(label,
      fmtNum(counts[k]), `cluster-${k.replaceAll("_", "-")}`,
      ["offline", "under_min_isr", "under_replicated"].includes(k) && counts[k] ? "bad" : ""))));
    put(nodes, table([
      { title: "Node", num: 1, cell: (n) => String(n.node_id) },
      { title: "Status", cell: (n) => h("span", { class: `pill ${n.live ? "ok" : "bad"}` },
        n.live ? "live" : "gone") },
      { title: "Address", cls: "val", cell: (n) => (n.live ? `${n.host}:${n.port}` : "–") },
      { title: "HTTP", num: 1, cell: (n) => (n.http_port === null ? "–" : String(n.http_port)) },
      { title: "Kafka", num: 1,
        cell: (n) => (n.kafka_port === null ? "–" : String(n.kafka_port)) },
      { title: "Role", cell: (n) => (n.controller ? "controller" : "") },
    ], s.nodes, {
      attrs: { id: "cluster-node-table" },
      rowAttrs: (n) => ({ "data-node": n.node_id, "data-live": String(n.live),
        "data-controller": String(n.controller) }),
    }));
    const bad = parts.partitions.filter((p) => p.state !== "online");
    put(attention, partitionTable(bad, "cluster-attention-table",
      "none: every partition has a leader and all its replicas in sync"));
    put(moves, movesTable(moving.moves));
    put(all, partitionTable(parts.partitions, "cluster-partition-table", "no partitions"),
      parts.truncated ? note("error", "More partitions than listed.") : "");
    await drawFigures(asked);
  };
  const tick = async () => {
    await draw();
    timer = setTimeout(tick, REFRESH_MS);
  };
  await tick();
  return () => clearTimeout(timer);
}
