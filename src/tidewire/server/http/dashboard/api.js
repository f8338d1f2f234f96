// Calls to the broker's API: same origin, the session cookie, and X-CSRF-Token on every
// call that may change something. Errors become ApiError with the status and the broker's
// message, so a page can say what failed.

export class ApiError extends Error {
  constructor(status, message, what) {
    super(message);
    this.status = status;
    this.what = what;
  }
}

export const session = {
  principal: null, csrf: null, authentication: null, permissions: null, expires_at: null,
};

export function setSession(doc) {
  session.principal = doc.principal ?? null;
  session.csrf = doc.csrf_token ?? null;
  session.authentication = doc.authentication ?? true;
  session.permissions = doc.permissions ?? null;
  session.expires_at = doc.expires_at ?? null;
}

export function clearSession() {
  setSession({ principal: null, csrf_token: null, authentication: session.authentication });
}

const SAFE = new Set(["GET", "HEAD"]);

export async function api(method, path, body, opts = {}) {
  const headers = { Accept: opts.accept || "application/json" };
  if (!SAFE.has(method) && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const what = `${method} ${path.split("?")[0]}`;
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, `the broker did not answer (${e.message})`, what);
  }
  if (opts.raw && r.ok) return r;
  const text = await r.text();
  let doc = null;
  if (text) {
    try { doc = JSON.parse(text); } catch { doc = null; }
  }
  if (!r.ok) {
    const msg = doc && doc.error ? (doc.error.message || doc.error) : (text || r.statusText);
    throw new ApiError(r.status, String(msg), what);
  }
  return doc;
}

export const get = (p, o) => api("GET", p, undefined, o);

// Several GETs at once, their answers in order. When some fail, the first of them in the
// order given is thrown (not whichever failed first in time), so a page that is refused two
// of its reads always says the same one.
export async function getAll(...paths) {
  const got = await Promise.allSettled(paths.map((p) => get(p)));
  const failed = got.find((r) => r.status === "rejected");
  if (failed) throw failed.reason;
  return got.map((r) => r.value);
}
export const post = (p, b) => api("POST", p, b === undefined ? {} : b);
export const patch = (p, b) => api("PATCH", p, b);
export const del = (p, b) => api("DELETE", p, b);

// What a refusal means, in words for the page.
export function describeError(e) {
  if (!(e instanceof ApiError)) return String(e && e.message ? e.message : e);
  if (e.status === 401) return `${e.what}: not signed in or the session expired (${e.message})`;
  if (e.status === 403) return `${e.what}: refused, no permission (${e.message})`;
  if (e.status === 404 && /no route/.test(e.message)) {
    return `${e.what}: this broker does not offer it (${e.message})`;
  }
  return `${e.what} failed (${e.status || "no answer"}): ${e.message}`;
}

// Whether the session may do `what`, one of the summary GET /v1/session answers:
// create_topics, alter_topics, delete_topics, publish, read_messages, alter_groups,
// describe_cluster, alter_cluster, read_audit ("somewhere": on some resource of the kind).
// True unless the summary says otherwise. The UI only hides; the broker decides.
export function can(what) {
  const p = session.permissions;
  return !(p && typeof p === "object" && p[what] === false);
}

export const enc = encodeURIComponent;
