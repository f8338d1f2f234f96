// The audit log, and users: principals with their keys, ACLs and quotas.

import { can, del, enc, get, getAll, post } from "./api.js";
import { clear, put, confirmDialog, fmtTime, h, note, table } from "./ui.js";
import { refusal } from "./pages_topics.js";

export async function auditPage(main) {
  const principal = h("input", { id: "audit-principal", placeholder: "any" });
  const action = h("input", { id: "audit-action", placeholder: "any, e.g. POST /v1/topics" });
  const outcome = h("select", { id: "audit-outcome" },
    ["", "allowed", "denied", "failed", "ok"].map((v) => h("option", { value: v }, v || "any")));
  const limit = h("input", { id: "audit-limit", type: "number", min: 1, value: "200" });
  const list = h("div", { id: "audit" });
  const form = h("form", { class: "toolbar" }, h("label", {}, "Principal", principal),
    h("label", {}, "Action", action), h("label", {}, "Outcome", outcome),
    h("label", {}, "Newest", limit), h("button", { class: "primary", type: "submit" }, "Show"));
  const draw = async (ev) => {
    if (ev) ev.preventDefault();
    const qs = new URLSearchParams({ limit: limit.value || "200" });
    if (principal.value) qs.set("principal", principal.value);
    if (action.value) qs.set("action", action.value);
    if (outcome.value) qs.set("outcome", outcome.value);
    try {
      const doc = await get(`/v1/audit?${qs}`);
      put(list, table([
        { title: "Time (UTC)", cell: (e) => fmtTime(e.time_ms) },
        { title: "Principal", cell: (e) => e.principal ?? "anonymous" },
        { title: "Source", cell: (e) => e.source },
        { title: "Interface", cell: (e) => e.interface },
        { title: "Action", cell: (e) => e.action },
        { title: "Resource", cell: (e) => e.resource },
        { title: "Outcome", cell: (e) => h("span", { class: e.outcome === "denied" || e.outcome === "failed"
          ? "bad" : "ok" }, e.outcome) },
        { title: "Reason", cell: (e) => e.reason },
      ], [...doc.events].reverse(), { empty: "no events match" }));
    } catch (e) {
      put(list, note("error", `Reading the audit log: ${refusal(e)}`));
    }
  };
  form.addEventListener("submit", draw);
  main.append(h("h1", {}, "Audit log"), h("p", { class: "muted" }, "Newest first."), form, list);
  await draw();
}

export async function securityPage(main) {
  const out = h("div");
  const body = h("div");
  main.append(h("h1", {}, "Users & ACLs"), out, body);
  const draw = async () => {
    const [principals, acls, quotas] = await getAll("/v1/principals", "/v1/acls", "/v1/quotas");
    put(body, 
      h("div", { class: "card" }, h("h2", {}, "Principals"), table([
        { title: "Name", cell: (p) => p.name }, { title: "Kind", cell: (p) => p.kind },
        { title: "Roles", cell: (p) => p.roles.join(", ") || "–" },
        { title: "Keys", cell: (p) => p.keys.map((k) => `${k.id} (${k.state})`).join(", ") || "–" },
        { title: "Created", cell: (p) => fmtTime(p.created_ms) },
        { title: "", cell: (p) => (can("alter_cluster") ? h("button", {
          onclick: () => newKey(p.name) }, "New key") : null) },
      ], principals.principals, { attrs: { id: "principals" } }),
      can("alter_cluster") ? principalForm() : null),
      h("div", { class: "card" }, h("h2", {}, "ACLs"), table([
        { title: "Principal", cell: (a) => a.principal },
        { title: "Resource", cell: (a) => `${a.resource_type}:${a.pattern}` +
          (a.pattern_type === "prefix" ? "*" : "") },
        { title: "Operation", cell: (a) => a.operation },
        { title: "Effect", cell: (a) => h("span", { class: a.effect === "deny" ? "bad" : "ok" }, a.effect) },
        { title: "", cell: (a) => (can("alter_cluster") ? h("button", { class: "danger",
          onclick: () => removeAcl(a) }, "Remove") : null) },
      ], acls.acls, { empty: "no ACLs", attrs: { id: "acls" } }),
      can("alter_cluster") ? aclForm() : null),
      h("div", { class: "card" }, h("h2", {}, "Quotas"), table([
        { title: "Principal", cell: (q) => q.principal },
        { title: "Produce bytes/s", num: 1, cell: (q) => q.produce_bytes_per_s },
        { title: "Fetch bytes/s", num: 1, cell: (q) => q.fetch_bytes_per_s },
        { title: "Requests/s", num: 1, cell: (q) => q.requests_per_s },
      ], [quotas.defaults, ...quotas.quotas])));
  };
  const act = async (what, fn) => {
    clear(out);
    try {
      const msg = await fn();
      out.append(note("success", msg));
      await draw();
    } catch (e) {
      out.append(note("error", `${what}: ${refusal(e)}`));
    }
  };
  const newKey = (name) => act(`New key for ${name}`, async () => {
    const k = await post(`/v1/principals/${enc(name)}/keys`, {});
    return `New key for ${name} (shown this once): ${k.api_key}`;
  });
  const removeAcl = async (a) => {
    if (!(await confirmDialog("Remove ACL", `${a.effect} ${a.principal} ${a.operation} on ` +
      `${a.resource_type}:${a.pattern}`, { action: "Remove" }))) return;
    act("Removing the ACL", async () => { await del("/v1/acls", { acls: [a] }); return "ACL removed."; });
  };
  const principalForm = () => {
    const name = h("input", { id: "new-principal", required: true });
    const roles = h("input", { id: "new-principal-roles", placeholder: "viewer, producer" });
    const f = h("form", { class: "toolbar" }, h("label", {}, "New principal", name),
      h("label", {}, "Roles", roles), h("button", { class: "primary", type: "submit" }, "Create"));
    f.addEventListener("submit", (ev) => {
      ev.preventDefault();
      act(`Creating ${name.value}`, async () => {
        await post("/v1/principals", { name: name.value.trim(),
          roles: roles.value.split(",").map((r) => r.trim()).filter(Boolean) });
        return `Created principal ${name.value}.`;
      });
    });
    return f;
  };
  const aclForm = () => {
    const sel = (id, vs) => h("select", { id }, vs.map((v) => h("option", { value: v }, v)));
    const principal = h("input", { id: "acl-principal", required: true, placeholder: "name or role:NAME" });
    const rtype = sel("acl-type", ["topic", "group", "cluster", "queue", "exchange", "stream"]);
    const pattern = h("input", { id: "acl-pattern", required: true, placeholder: "name or *" });
    const ptype = sel("acl-pattern-type", ["literal", "prefix"]);
    const op = sel("acl-op", ["read", "write", "create", "delete", "describe", "alter", "admin", "all"]);
    const effect = sel("acl-effect", ["allow", "deny"]);
    const f = h("form", { class: "toolbar" }, h("label", {}, "Principal", principal),
      h("label", {}, "Resource", rtype), h("label", {}, "Pattern", pattern),
      h("label", {}, "Match", ptype), h("label", {}, "Operation", op), h("label", {}, "Effect", effect),
      h("button", { class: "primary", type: "submit" }, "Add ACL"));
    f.addEventListener("submit", (ev) => {
      ev.preventDefault();
      act("Adding the ACL", async () => {
        await post("/v1/acls", { acls: [{ principal: principal.value.trim(), resource_type: rtype.value,
          pattern: pattern.value.trim(), pattern_type: ptype.value, operation: op.value,
          effect: effect.value }] });
        return "ACL added.";
      });
    });
    return f;
  };
  await draw();
}
