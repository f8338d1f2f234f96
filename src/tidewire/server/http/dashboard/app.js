// The dashboard's entry: the session, the navigation and the hash router
// (#/overview, #/topics, #/topic/NAME, #/tail/NAME, #/groups, #/group/ID, #/queues,
// #/queue/NAME, #/streams, #/stream/ID, #/kafka, #/cluster, #/metrics, #/settings, #/audit,
// #/security, #/login). The Cluster page is listed only on a node of a cluster.

import { ApiError, api, can, clearSession, get, session, setSession } from "./api.js";
import { clear, h, hideBanner, note, showError, showInfo } from "./ui.js";
import { overviewPage, metricsPage, settingsPage } from "./pages_overview.js";
import { topicsPage, topicPage } from "./pages_topics.js";
import { tailPage } from "./pages_tail.js";
import { groupsPage, groupPage } from "./pages_groups.js";
import { queuesPage, queuePage } from "./pages_queues.js";
import { streamsPage, streamPage } from "./pages_streams.js";
import { kafkaPage } from "./pages_kafka.js";
import { clusterPage } from "./pages_cluster.js";
import { auditPage, securityPage } from "./pages_admin.js";

const PAGES = {
  overview: { title: "Overview", render: overviewPage },
  topics: { title: "Topics", render: topicsPage },
  topic: { render: topicPage, nav: "topics" },
  tail: { title: "Live tail", render: tailPage, needs: "read_messages" },
  groups: { title: "Consumer groups", render: groupsPage },
  group: { render: groupPage, nav: "groups" },
  queues: { title: "Queues", render: queuesPage },
  queue: { render: queuePage, nav: "queues" },
  streams: { title: "Streams", render: streamsPage },
  stream: { render: streamPage, nav: "streams" },
  kafka: { title: "Kafka", render: kafkaPage },
  cluster: { title: "Cluster", render: clusterPage, needs: "describe_cluster", cluster: true },
  metrics: { title: "Metrics", render: metricsPage },
  settings: { title: "Settings", render: settingsPage, needs: "describe_cluster" },
  audit: { title: "Audit log", render: auditPage, needs: "read_audit" },
  security: { title: "Users & ACLs", render: securityPage, needs: "describe_cluster" },
  login: { render: loginPage },
};

let cleanup = null;
let sessionKnown = false;
// Whether the broker is a node of a cluster: the page's tidewire-cluster meta tag names the
// node (empty on a single node, where GET /v1/cluster is a 404).
const inCluster = Boolean(document.querySelector('meta[name="tidewire-cluster"]')?.content);

function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [name, ...rest] = raw.split("/");
  return { name: name || "overview", arg: rest.length ? decodeURIComponent(rest.join("/")) : "" };
}

function renderNav(active) {
  const nav = clear(document.getElementById("nav"));
  if (session.authentication && !session.principal) return;
  for (const [name, p] of Object.entries(PAGES)) {
    if (!p.title || (p.needs && !can(p.needs)) || (p.cluster && !inCluster)) continue;
    nav.append(h("a", { href: `#/${name}`, class: name === active ? "active" : "",
      id: `nav-${name}` }, p.title));
  }
  const who = clear(document.getElementById("who"));
  if (session.authentication === false) {
    who.append("authentication off");
  } else if (session.principal) {
    who.append(`signed in as ${session.principal}`,
      h("button", { id: "logout", onclick: logout }, "Sign out"));
  }
}

async function loadSession() {
  try {
    setSession(await get("/v1/session"));
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      setSession({ principal: null, authentication: true });
    } else if (e instanceof ApiError && e.status === 404) {
      // A broker without sessions: ask who we are instead; sign-in is not available.
      const who = await get("/v1/whoami");
      setSession({ principal: who.principal || "anonymous", authentication: who.authentication });
      showInfo("This broker offers no /v1/session: sign-in from the page is not available.");
    } else {
      throw e;
    }
  }
  sessionKnown = true;
}

async function logout() {
  try {
    await api("DELETE", "/v1/session");
  } catch (e) {
    showError(e, "Sign out");
    return;
  }
  clearSession();
  location.hash = "#/login";
}

function loginPage(main) {
  const key = h("input", { type: "password", id: "api-key", autocomplete: "off",
    placeholder: "twk_…", required: true });
  const out = h("div");
  const form = h("form", { class: "card" },
    h("h1", {}, "Sign in"),
    h("label", {}, "API key", key),
    h("button", { class: "primary", type: "submit", id: "login" }, "Sign in"), out);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    try {
      setSession(await api("POST", "/v1/session", { api_key: key.value }));
      key.value = "";
      location.hash = "#/overview";
    } catch (e) {
      out.append(note("error", e instanceof ApiError && e.status === 401
        ? `Sign-in refused: ${e.message}` : `Sign-in failed: ${e.message}`));
    }
  });
  main.append(h("div", { class: "login" }, form,
    h("p", { class: "muted" }, "The key is exchanged for a session cookie (HttpOnly, " +
      "SameSite=Strict); the page never stores it.")));
  key.focus();
}

async function show() {
  if (cleanup) { try { cleanup(); } catch { /* the page is gone either way */ } cleanup = null; }
  hideBanner();
  const main = clear(document.getElementById("main"));
  try {
    if (!sessionKnown) await loadSession();
  } catch (e) {
    showError(e, "Loading the session");
    return;
  }
  let { name, arg } = route();
  if (session.authentication && !session.principal && name !== "login") {
    location.hash = "#/login";
    return;
  }
  if (name === "login" && (!session.authentication || session.principal)) name = "overview";
  const page = PAGES[name] || PAGES.overview;
  renderNav(page.nav || name);
  try {
    cleanup = (await page.render(main, arg)) || null;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401 && session.authentication) {
      clearSession();
          location.hash = "#/login";
      return;
    }
    showError(e);
  }
}

window.addEventListener("hashchange", show);
window.addEventListener("unhandledrejection", (ev) => {
  ev.preventDefault();
  showError(ev.reason);
});
show();
