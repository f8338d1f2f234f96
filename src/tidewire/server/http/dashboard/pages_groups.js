// Consumer groups: the paginated list with lag; a group's members, assignment, lag per
// partition and over time, and the offset reset (a dry run first, then applied).

import { can, enc, get, post } from "./api.js";
import { lineChart } from "./chart.js";
import { clear, put, confirmDialog, fmtNum, h, link, note, table } from "./ui.js";
import { listPage, pager, refusal } from "./pages_topics.js";

function totalLag(d) {
  const lags = (d.offsets || []).map((o) => o.lag).filter((l) => l >= 0);
  return lags.length ? lags.reduce((a, b) => a + b, 0) : null;
}

export async function groupsPage(main) {
  const state = { q: "", sort: "name", offset: 0 };
  const filter = h("input", { placeholder: "filter by id", id: "group-filter" });
  const list = h("div", { id: "group-list" });
  let debounce = null;
  filter.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.q = filter.value.trim(); state.offset = 0; draw(); }, 250);
  });
  const draw = async () => {
    let got;
    try {
      got = await listPage("/v1/groups", "groups", { ...state, match: (g) => g.group });
    } catch (e) {
      put(list, note("error", `Listing groups failed: ${e.message}`));
      return;
    }
    // A list without lag: ask each group of this page (at most one page of them).
    await Promise.all(got.items.filter((g) => g.lag === undefined).map(async (g) => {
      try { g.lag = totalLag(await get(`/v1/groups/${enc(g.group)}`)); } catch { g.lag = null; }
    }));
    const onSort = (f) => { state.sort = state.sort === f ? `-${f}` : f; draw(); };
    put(list, table([
      { title: "Group", sort: "name", cell: (g) => link(`#/group/${enc(g.group)}`, g.group) },
      { title: "State", sort: "state", cell: (g) => g.state },
      { title: "Members", sort: "members", num: 1, cell: (g) => g.members },
      { title: "Lag", sort: "lag", num: 1, cell: (g) => (g.lag === null || g.lag < 0 ? "–" : fmtNum(g.lag)) },
    ], got.items, { onSort, sorted: state.sort, empty: "no consumer groups" }),
    pager(state, got.total, draw));
  };
  main.append(h("h1", {}, "Consumer groups"),
    h("div", { class: "toolbar" }, h("label", {}, "Filter", filter)), list);
  await draw();
}

export async function groupPage(main, group) {
  const d = await get(`/v1/groups/${enc(group)}`);
  const lag = totalLag(d);
  main.append(h("h1", {}, `Group ${group}`),
    h("p", {}, `State ${d.state} · generation ${d.generation} · strategy ${d.strategy || "–"} · ` +
      `total lag ${lag === null ? "–" : fmtNum(lag)}`),
    h("div", { class: "card" }, h("h2", {}, "Members"), table([
      { title: "Member", cls: "val", cell: (m) => m.member_id },
      { title: "Client", cell: (m) => m.client_id },
      { title: "Instance", cell: (m) => m.group_instance_id || "–" },
      { title: "Subscription", cell: (m) => m.pattern || m.topics.join(", ") },
      { title: "Assignment", cell: (m) => m.assignment.map(([t, p]) => `${t}[${p}]`).join(", ") },
    ], d.members, { empty: "no members", attrs: { id: "members" } })),
    h("div", { class: "card" }, h("h2", {}, "Offsets and lag"), table([
      { title: "Topic", cell: (o) => link(`#/topic/${enc(o.topic)}`, o.topic) },
      { title: "Partition", num: 1, cell: (o) => o.partition },
      { title: "Committed", num: 1, cell: (o) => (o.committed < 0 ? "none" : fmtNum(o.committed)) },
      { title: "End offset", num: 1, cell: (o) => fmtNum(o.end_offset) },
      { title: "Lag", num: 1, cell: (o) => (o.lag < 0 ? "–" : fmtNum(o.lag)) },
    ], d.offsets, { empty: "nothing committed", attrs: { id: "offsets" } })));
  const chart = h("div", { class: "charts", id: "lag-chart" });
  main.append(h("h2", {}, "Lag over time"), chart);
  try {
    const rec = await get("/v1/metrics/recent");
    chart.append(lineChart(`Lag of ${group}`, (rec.group_lag || {})[group] || [], fmtNum));
  } catch (e) {
    chart.append(note("error", `Lag history (GET /v1/metrics/recent): ${e.message}`));
  }
  if (can("alter_groups")) main.append(resetCard(group, d));
}

function resetCard(group, d) {
  const topics = [...new Set([...d.offsets.map((o) => o.topic),
    ...d.members.flatMap((m) => m.topics)])];
  const topic = topics.length
    ? h("select", { id: "reset-topic" }, topics.map((t) => h("option", { value: t }, t)))
    : h("input", { id: "reset-topic", placeholder: "topic" });
  const to = h("select", { id: "reset-to" }, ["earliest", "latest", "offset", "timestamp"]
    .map((v) => h("option", { value: v }, v)));
  const value = h("input", { id: "reset-value", type: "number", min: 0,
    placeholder: "offset, or ms since the epoch" });
  const out = h("div", { id: "reset-result" });
  const apply = h("button", { class: "danger", type: "button", id: "reset-apply", disabled: true },
    "Apply reset");
  let planned = null;
  const body = () => {
    const b = { topic: topic.value, to: to.value };
    if (to.value === "offset") b.offset = Number(value.value);
    if (to.value === "timestamp") b.timestamp = Number(value.value);
    return b;
  };
  const changes = (r) => table([
    { title: "Topic", cell: (p) => p.topic }, { title: "Partition", num: 1, cell: (p) => p.partition },
    { title: "Previous", num: 1, cell: (p) => (p.previous < 0 ? "none" : fmtNum(p.previous)) },
    { title: "New offset", num: 1, cell: (p) => fmtNum(p.offset) },
    { title: "Lag after", num: 1, cell: (p) => (p.lag === undefined ? "–" : fmtNum(p.lag)) },
  ], r.partitions, { empty: "no partition would change" });
  const dry = h("button", { class: "primary", type: "submit", id: "reset-dry-run" }, "Dry run");
  const form = h("form", { class: "card", id: "reset" }, h("h2", {}, "Reset offsets"),
    h("p", { class: "muted" }, "Only a group without members can be reset. A dry run shows " +
      "what would change; apply it to commit exactly that."),
    h("div", { class: "toolbar" }, h("label", {}, "Topic", topic), h("label", {}, "To", to),
      h("label", {}, "Offset / time", value), dry, apply), out);
  for (const el of [topic, to, value]) {
    el.addEventListener("change", () => { planned = null; apply.disabled = true; });
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    apply.disabled = true;
    try {
      const r = await post(`/v1/groups/${enc(group)}/reset`, { ...body(), dry_run: true });
      planned = body();
      out.append(note("success", "Dry run: nothing changed yet. Apply to commit these offsets."),
        changes(r));
      apply.disabled = false;
    } catch (e) {
      out.append(note("error", `Dry run: ${refusal(e)}`));
    }
  });
  apply.addEventListener("click", async () => {
    if (!planned) return;
    if (!(await confirmDialog(`Reset ${group}`, `Commit the offsets of the dry run for ` +
      `${planned.topic} (to ${planned.to})?`, { action: "Apply" }))) return;
    clear(out);
    try {
      const r = await post(`/v1/groups/${enc(group)}/reset`, { ...planned, dry_run: false });
      out.append(note("success", `Reset applied to ${r.partitions.length} partition(s).`), changes(r));
    } catch (e) {
      out.append(note("error", `Reset: ${refusal(e)}`));
    }
    apply.disabled = true;
    planned = null;
  });
  return form;
}
