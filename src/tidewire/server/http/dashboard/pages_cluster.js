// The cluster, as the node serving the page sees it: the controller, every node (live or
// gone, with its addresses), the partition counts by state, and the partitions that need
// attention (offline, under min ISR, under-replicated) above the table of every partition,
// with each one's leader, epoch, replicas, ISR, high watermark and lag, and the moves
// (reassignments) in progress: target, replicas added and removed, records left to copy.
// The figures are GET /v1/cluster, GET /v1/cluster/partitions and GET
// /v1/cluster/reassignments (the same ones /metrics exports as tidewire_cluster_*),
// refreshed every few seconds. The page is in the navigation only when
// the broker is a node of a cluster (GET /v1/cluster answers).

import { get } from "./api.js";
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

export async function clusterPage(main) {
  const head = h("div", { id: "cluster-head" });
  const cards = h("div", { id: "cluster-totals" });
  const nodes = h("div", { id: "cluster-nodes" });
  const attention = h("div", { id: "cluster-attention" });
  const moves = h("div", { id: "cluster-moves" });
  const all = h("div", { id: "cluster-all" });
  main.append(h("h1", {}, "Cluster"), head, cards, h("h2", {}, "Nodes"), nodes,
    h("h2", {}, "Partitions that need attention"), attention,
    h("h2", {}, "Moves in progress"), moves,
    h("h2", {}, "Every partition"), all,
    h("p", { class: "muted" }, `As the node serving this page sees the cluster (its copy ` +
      `of the metadata in etcd), refreshed every ${REFRESH_MS / 1000} s. High watermark and ` +
      `lag are known where this node holds a replica: every follower's lag where it leads, ` +
      `its own where it follows.`));
  let timer = null;
  const draw = async () => {
    let s;
    let parts;
    let moving;
    try {
      [s, parts, moving] = await Promise.all([get("/v1/cluster"), get("/v1/cluster/partitions"),
        get("/v1/cluster/reassignments")]);
    } catch (e) {
      put(head, note("error", `The cluster's status (GET /v1/cluster): ${refusal(e)}`));
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
  };
  const tick = async () => {
    await draw();
    timer = setTimeout(tick, REFRESH_MS);
  };
  await tick();
  return () => clearTimeout(timer);
}
