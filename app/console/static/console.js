// Berth console: plain JavaScript, no library, no build step. It talks to the public API only.
//
// The API key lives in this tab's sessionStorage and goes out as the bearer header of each
// call (never in a URL, never in a cookie). Everything shown is built with DOM nodes and
// textContent: no HTML is ever parsed from data, so ids, labels and messages show as text.
"use strict";

(() => {
  const KEY_STORAGE = "berth.apiKey";
  const REFRESH_MS = 5000;
  const DETAILS_MAX = 25;
  // The API lives where the console does, minus /console (works behind a path prefix too).
  const BASE = location.pathname.replace(/\/console(\/.*)?$/, "");

  const state = {
    key: sessionStorage.getItem(KEY_STORAGE),
    role: null,
    timer: null,
    following: false,
    loading: false,
    generation: 0,
  };

  // --- DOM helpers -------------------------------------------------------------------------

  /** Build an element: attrs are attributes (on* are listeners), children nodes or text. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else if (name === "text") el.textContent = String(value);
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const $ = (id) => document.getElementById(id);

  /** Build a table; with ``stack``, a narrow screen shows each row as a block of labelled cells. */
  function table(headers, rows, empty, { stack = false } = {}) {
    if (!rows.length) return h("p", { class: "empty" }, empty || "Nothing to show.");
    const labels = headers.map((c) => (Array.isArray(c) ? c[0] : c));
    const head = h("tr", {}, headers.map((c) => {
      const [label, cls] = Array.isArray(c) ? c : [c, null];
      return h("th", { scope: "col", class: cls }, label);
    }));
    if (stack) {
      for (const row of rows) [...row.children].forEach((cell, i) => { cell.dataset.label = labels[i] || ""; });
    }
    return h("div", { class: stack ? "table-wrap stack" : "table-wrap" },
      h("table", {}, h("thead", {}, head), h("tbody", {}, rows)));
  }

  function bar(value, max, cls) {
    const pct = max > 0 ? Math.max(0, Math.min(100, (100 * value) / max)) : 0;
    let level = cls || "";
    if (!cls) level = pct >= 100 ? "full" : pct >= 80 ? "high" : "";
    const span = h("span");
    span.style.width = `${pct.toFixed(1)}%`;
    return h("div", {
      class: `bar ${level}`, role: "img",
      "aria-label": `${pct.toFixed(0)} percent`,
    }, span);
  }

  function badge(text, kind) {
    return h("span", { class: `badge ${kind}` }, text);
  }

  function labelChips(labels) {
    const entries = Object.entries(labels || {});
    if (!entries.length) return h("span", { class: "muted" }, "none");
    return h("div", { class: "labels" },
      entries.map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`)));
  }

  // --- formatting --------------------------------------------------------------------------

  function when(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return `${d.toISOString().replace("T", " ").slice(0, 19)} UTC`;
  }

  function ago(iso) {
    if (!iso) return "never";
    const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
    if (s < 0) return `in ${duration(-s)}`;
    return `${duration(s)} ago`;
  }

  function duration(s) {
    if (s < 90) return `${Math.round(s)} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} days`;
  }

  /** Write ``v`` with thousands grouped and at most ``digits`` decimals: 1,500 or 0.25. */
  const grouped = (v, digits = 0) => v.toLocaleString("en-US", { maximumFractionDigits: digits });

  // The API counts CPU in millicores and memory in MiB; people read cores and GiB.
  const RESOURCES = [
    ["cpuMillis", "CPU", (v) => `${grouped(v / 1000, 2)} ${v === 1000 ? "core" : "cores"}`],
    ["memoryMiB", "Memory", (v) => (v >= 1024 ? `${grouped(v / 1024, 1)} GiB` : `${grouped(v)} MiB`)],
    ["llmSlots", "LLM slots", (v) => grouped(v)],
  ];
  const UNITS = "CPU in cores (1 core = 1,000 millicores, the API's cpuMillis) and memory in GiB "
    + "(1 GiB = 1,024 MiB, the API's memoryMiB).";

  function unitsNote() {
    return h("p", { class: "muted", "data-units": "" }, UNITS);
  }

  const shortId = (id) => String(id).slice(0, 8) + "…" + String(id).slice(-4);
  const num = (v, digits = 1) => (typeof v === "number" ? v.toFixed(digits) : "—");

  // --- the API -----------------------------------------------------------------------------

  class Problem extends Error {
    constructor(status, title, detail) {
      super(`${title}: ${detail}`);
      this.status = status;
      this.title = title;
      this.detail = detail;
    }
  }

  async function api(method, path, options = {}) {
    const headers = { Accept: "application/json", Authorization: `Bearer ${state.key}` };
    Object.assign(headers, options.headers || {});
    const init = {
      method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
    };
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    let response;
    try {
      response = await fetch(BASE + path, init);
    } catch (error) {
      throw new Problem(0, "Cannot reach Berth", String(error && error.message || error));
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const title = (data && data.title) || response.statusText || `HTTP ${response.status}`;
      const detail = (data && data.detail) || text.slice(0, 300) || "(no detail)";
      throw new Problem(response.status, title, detail);
    }
    return data;
  }

  /** Return every item of a paginated list, up to ``pages`` pages. */
  async function listAll(path, pages = 10) {
    const items = [];
    let cursor = null;
    for (let i = 0; i < pages; i += 1) {
      const sep = path.includes("?") ? "&" : "?";
      const page = await api("GET", cursor ? `${path}${sep}cursor=${encodeURIComponent(cursor)}` : path);
      items.push(...page.items);
      cursor = page.nextCursor;
      if (!cursor) break;
    }
    return items;
  }

  /** Answer true for 2xx, false for 403 (the key may not), and raise anything else. */
  async function allowed(path) {
    try {
      await api("GET", path);
      return true;
    } catch (error) {
      if (error.status === 403) return false;
      throw error;
    }
  }

  // The pages of the navigation each role may read; the first is where it lands.
  const ROLE_PAGES = {
    admin: ["queue", "pools", "tenants"],
    operator: ["queue", "pools"],
    tenant: ["queue", "pools", "tenants"],
    runtime: ["pools"],
  };

  async function roleProbe() {
    if (await allowed("/v1/keys?limit=1")) return "admin";
    if (await allowed("/v1/tasks?limit=1")) return "tenant";
    if (await allowed("/v1/queue")) return "operator";
    return "runtime";
  }

  // --- problems ----------------------------------------------------------------------------

  function problemShow(error, where) {
    const box = where || $("problem");
    box.replaceChildren(
      h("strong", {}, error.title || "Something went wrong"),
      h("span", {}, error.detail || String(error.message || error)),
    );
    box.hidden = false;
  }

  function problemClear() {
    $("problem").hidden = true;
    $("problem").replaceChildren();
  }

  // --- sign in -----------------------------------------------------------------------------

  function signedOut(error) {
    state.key = null;
    state.role = null;
    sessionStorage.removeItem(KEY_STORAGE);
    clearInterval(state.timer);
    $("nav").hidden = true;
    $("signout").hidden = true;
    $("who").textContent = "";
    $("view").hidden = true;
    $("view").replaceChildren();
    $("signin").hidden = false;
    $("updated").textContent = "";
    if (error) problemShow(error);
    $("key").focus();
  }

  async function signIn(key) {
    state.key = key;
    try {
      state.role = await roleProbe();
    } catch (error) {
      signedOut(error);
      return;
    }
    sessionStorage.setItem(KEY_STORAGE, key);
    problemClear();
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("signout").hidden = false;
    $("who").textContent = `Signed in as ${state.role} (key ${key.slice(0, 12)}…)`;
    for (const link of document.querySelectorAll("#nav a")) {
      link.hidden = !ROLE_PAGES[state.role].includes(link.dataset.page);
    }
    $("view").hidden = false;
    clearInterval(state.timer);
    state.timer = setInterval(() => queueFollowed() || refresh(false), REFRESH_MS);
    if (!location.hash || location.hash === "#") location.hash = "#/queue";
    else refresh(true);
  }

  // --- the router --------------------------------------------------------------------------

  const pages = {};

  function route() {
    const readable = ROLE_PAGES[state.role];
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    // A task's page is open to any key (the API answers for it); a page of the navigation only
    // to the roles that may read it. Anything else is the role's landing page.
    const open = pages[parts[0]] && (readable.includes(parts[0]) || !ROLE_PAGES.admin.includes(parts[0]));
    return open ? { page: parts[0], args: parts.slice(1) } : { page: readable[0], args: [] };
  }

  /** Load the current page and swap it in whole; ``moved`` says the route changed. */
  async function refresh(moved) {
    if (!state.key || !state.role) return;
    if ($("dialog").open && !moved) return;
    const generation = ++state.generation;
    const { page, args } = route();
    // A page this key may not read (or none) was asked for: the address shows the landing page.
    if (moved && location.hash.replace(/^#\/?/, "").split("/")[0] !== page) {
      history.replaceState(null, "", `#/${page}`);
    }
    for (const link of document.querySelectorAll("#nav a")) {
      if (link.dataset.page === page) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    let node;
    try {
      node = await pages[page](args);
    } catch (error) {
      if (generation !== state.generation) return;
      if (error.status === 401) {
        signedOut(error);
        return;
      }
      problemShow(error);
      if (moved) $("view").replaceChildren(h("h1", { tabindex: "-1" }, "Could not load this page"));
      return;
    }
    if (generation !== state.generation) return;
    problemClear();
    const view = $("view");
    const focused = document.activeElement && view.contains(document.activeElement)
      ? document.activeElement.dataset.focus : null;
    view.replaceChildren(node);
    if (focused) {
      const again = view.querySelector(`[data-focus="${CSS.escape(focused)}"]`);
      if (again) again.focus();
    } else if (moved) {
      const title = view.querySelector("h1");
      if (title) {
        title.setAttribute("tabindex", "-1");
        title.focus();
      }
    }
    $("updated").textContent = `Updated ${when(new Date().toISOString())} · ${
      queueFollowed() ? "follows changes as they happen" : `refreshes every ${REFRESH_MS / 1000} s`}`;
  }

  // --- Replay of a task's decision (admin) ----------------------------------------------------

  /** Replays already run, by task id: the page refreshes, a replay is asked for once. */
  const replays = new Map();

  pages.replay = async (args) => {
    const id = args[0] || "";
    const title = h("h1", {}, "Replay of task ", h("span", { class: "mono" }, id));
    if (state.role !== "admin") {
      return h("div", {}, title, h("p", {}, "Replays are for admins: an admin opening this page " +
        "has this build plan the pass that placed the task again and compare."));
    }
    if (!replays.has(id)) replays.set(id, await api("POST", "/v1/replays", { body: { taskId: id } }));
    const r = replays.get(id);
    const c = r.changed.find((x) => x.taskId === id);
    const side = (d) => `${d.poolId || d.pendingCode} (score ${d.score === null ? "—" : num(d.score)})`;
    return h("div", {}, title,
      h("p", { "data-replay": c ? "changed" : "identical" }, `Pass ${(r.summary.passIds || [])[0] || "?"}: `,
        c ? `committed ${side(c.committed)}, now ${side(c.replayed)}; differs in ${c.why.join(", ")}`
          : `identical: ${r.identical} of ${r.decisions} decisions of the pass are the same.`),
      h("p", { class: "muted" }, "The pass is planned again from its own recorded inputs."));
  };

  // --- Queue -------------------------------------------------------------------------------

  // The Queue page follows the watch feed (a long poll of GET /v1/watch): each change the key
  // may see reloads it, instead of the timer. An operator's feed holds its pools and their
  // leases, not the tasks waiting for them, so its Queue page keeps the timer; so does any
  // page while the feed cannot be read.
  const FOLLOW_WAIT_S = 25;

  function queueFollowed() {
    return state.following && route().page === "queue";
  }

  async function queueFollow() {
    if (state.following || !["admin", "tenant"].includes(state.role)) return;
    state.following = true;
    const key = state.key;
    let cursor = "now";
    try {
      while (state.key === key && route().page === "queue") {
        const page = await api("GET",
          `/v1/watch?types=task&wait=${FOLLOW_WAIT_S}&after=${encodeURIComponent(cursor)}`);
        cursor = page.cursor;
        if (page.items.length && route().page === "queue") await refresh(false);
      }
    } catch (_) {
      // The timer takes over; the next visit to the page follows the feed again.
    } finally {
      state.following = false;
    }
  }

  pages.queue = async () => {
    queueFollow();
    const summary = await api("GET", "/v1/queue");
    const out = [
      h("h1", {}, "Queue"),
      h("p", { class: "lead" }, state.role === "tenant"
        ? "Your tasks that wait, and why."
        : state.role === "operator"
          ? "Tasks waiting for the runtime classes and tenants your pools serve."
          : "Every waiting task, by runtime class and reason."),
      h("div", { class: "stats" },
        stat(summary.pending, "waiting"),
        stat(summary.parked, "parked until something changes"),
        stat(summary.oldestPendingSeconds == null ? "—" : duration(summary.oldestPendingSeconds),
          "oldest waiting")),
      h("h2", {}, "Waiting by runtime class and reason"),
    ];
    const most = Math.max(1, ...summary.items.map((i) => i.pending));
    out.push(table(
      ["Runtime class", "Reason (closest miss)", ["Waiting", "num"], "", ["Parked", "num"]],
      summary.items.map((i) => h("tr", {},
        h("td", { class: "mono" }, i.runtimeClass),
        h("td", {}, h("code", {}, i.code)),
        h("td", { class: "num" }, i.pending),
        h("td", {}, bar(i.pending, most, "plain")),
        h("td", { class: "num" }, i.parked))),
      "Nothing is waiting.", { stack: true },
    ));
    if (state.role === "tenant") {
      out.push(...await tenantTasks());
    }
    return h("div", {}, out);
  };

  function stat(n, label) {
    return h("div", { class: "stat" }, h("span", { class: "n" }, n), h("span", { class: "l" }, label));
  }

  function taskLink(id) {
    return h("a", { href: `#/tasks/${encodeURIComponent(id)}`, class: "mono", "data-focus": `task-${id}` },
      shortId(id));
  }

  async function tenantTasks() {
    const [waiting, placed] = await Promise.all([
      api("GET", "/v1/tasks?state=ADMITTED&limit=100"),
      api("GET", "/v1/tasks?state=LEASED&limit=20"),
    ]);
    // Position and ETA are only in a task's own answer: ask for the first few.
    const details = await Promise.all(waiting.items.slice(0, DETAILS_MAX).map(
      (t) => api("GET", `/v1/tasks/${encodeURIComponent(t.id)}`).catch(() => null)));
    const byId = new Map(details.filter(Boolean).map((t) => [t.id, t]));
    const rows = waiting.items.map((t) => byId.get(t.id) || t);
    rows.sort((a, b) => (a.spec.runtimeClass.localeCompare(b.spec.runtimeClass)
      || String(a.pendingReason && a.pendingReason.code).localeCompare(String(b.pendingReason && b.pendingReason.code))
      || ((a.queue && a.queue.position) || 1e12) - ((b.queue && b.queue.position) || 1e12)));
    const pending = table(
      ["Task", "Runtime class", "Closest miss", "Why", ["Position", "num"], "Estimated start"],
      rows.map((t) => {
        const reason = t.pendingReason;
        const q = t.queue;
        return h("tr", { "data-task": t.id },
          h("td", {}, taskLink(t.id)),
          h("td", { class: "mono" }, t.spec.runtimeClass),
          h("td", {}, reason ? h("code", {}, reason.code) : h("span", { class: "muted" }, "not examined yet")),
          h("td", {}, reason ? reason.message : ""),
          h("td", { class: "num" }, q && q.position != null ? `${q.position} of ${q.competing + 1}` : "—"),
          h("td", { title: q ? q.estimate : "" },
            q && q.estimatedStartAt ? `${when(q.estimatedStartAt)} (${ago(q.estimatedStartAt)})`
              : h("span", { class: "muted" }, q ? q.estimate : "—")));
      }),
      "None of your tasks is waiting.", { stack: true },
    );
    const leased = table(
      ["Task", "Runtime class", "Pool", ["Score", "num"], "Leased"],
      placed.items.map((t) => h("tr", { "data-task": t.id },
        h("td", {}, taskLink(t.id)),
        h("td", { class: "mono" }, t.spec.runtimeClass),
        h("td", { class: "mono" }, t.placement ? t.placement.poolId : "—"),
        h("td", { class: "num" }, t.placement ? num(t.placement.score) : "—"),
        h("td", {}, ago(t.leasedAt)))),
      "None of your tasks is running.", { stack: true },
    );
    return [h("h2", {}, "Your waiting tasks"), pending, h("h2", {}, "Running now"), leased];
  }

  // --- Task --------------------------------------------------------------------------------

  const FINISHED_STATES = ["SUCCEEDED", "FAILED", "CANCELLED"];

  pages.tasks = async (args) => {
    const id = args[0];
    if (!id) {
      location.hash = "#/queue";
      return h("div");
    }
    const path = `/v1/tasks/${encodeURIComponent(id)}`;
    const [task, events] = await Promise.all([
      api("GET", path),
      listAll(`${path}/events?limit=200`, 5),
    ]);
    // A finished task goes nowhere again: its page previews nothing (and so re-runs nothing).
    const finished = FINISHED_STATES.includes(task.state);
    let preview = null;
    let previewProblem = null;
    if (!finished) {
      try {
        preview = await api("POST", "/v1/placements/preview",
          { body: task.spec, headers: { "X-Berth-Tenant": task.tenantId } });
      } catch (error) {
        previewProblem = error;
      }
    }
    const stateKind = { ADMITTED: "warn", LEASED: "ok", SUCCEEDED: "ok", FAILED: "bad", CANCELLED: "info" };
    const out = [
      h("p", {}, h("a", { href: "#/queue" }, "← Queue")),
      h("h1", {}, "Task ", h("span", { class: "mono" }, task.id), " ", badge(task.state, stateKind[task.state] || "info")),
      h("dl", { class: "kv" },
        h("dt", {}, "Tenant"), h("dd", { class: "mono" }, task.tenantId),
        h("dt", {}, "Runtime class"), h("dd", { class: "mono" }, task.spec.runtimeClass),
        h("dt", {}, "Requests"), h("dd", { title: UNITS }, RESOURCES.map(([k, label, fmt]) =>
          `${label} ${fmt((task.spec.requests || {})[k] || 0)}`).join(" · ")),
        h("dt", {}, "Priority"), h("dd", {}, task.priority),
        h("dt", {}, "Attempts"), h("dd", {}, `${task.attempts} of ${task.maxAttempts} used`),
        h("dt", {}, "Submitted"), h("dd", {}, `${when(task.createdAt)} (${ago(task.createdAt)})`),
        h("dt", {}, "Labels"), h("dd", {}, labelChips(task.spec.labels)),
        task.failureReason ? [h("dt", {}, "Failure"), h("dd", {}, task.failureReason)] : null),
    ];
    if (task.pendingReason) out.push(...waitingSection(task));
    if (task.placement) out.push(...decisionSection(task.placement));
    if (task.placement) {
      out.push(h("p", { class: "replay" }, h("a", { href: `#/replay/${encodeURIComponent(task.id)}` },
        "Replay this decision"), " — an admin opening this link has this build plan the pass that placed it again."));
    }
    if (!finished) out.push(...previewSection(preview, previewProblem, task));
    out.push(...leaseSection(task));
    out.push(h("h2", {}, "Events"), timeline(events));
    return h("div", {}, out);
  };

  function waitingSection(task) {
    const reason = task.pendingReason;
    const q = task.queue;
    const rejections = Object.entries(reason.rejections || {}).sort((a, b) => b[1] - a[1]);
    return [
      h("h2", {}, "Why it waits"),
      h("div", { class: "closest", "data-closest": reason.code },
        h("div", {}, "Closest miss: ", h("span", { class: "code" }, reason.code)),
        h("div", {}, reason.message)),
      q ? h("dl", { class: "kv" },
        h("dt", {}, "Position"), h("dd", { "data-position": q.position == null ? "" : q.position },
          q.position == null ? "not waiting for capacity (see How)"
            : `${q.position} of ${q.competing + 1} waiting for the same pools (${q.policy}${q.exact ? "" : ", at least"})`),
        h("dt", {}, "Estimated start"), h("dd", {},
          q.estimatedStartAt ? `${when(q.estimatedStartAt)} (${ago(q.estimatedStartAt)})` : "no estimate"),
        h("dt", {}, "How"), h("dd", {}, q.estimate)) : null,
      h("h3", {}, "Pools rejected, by reason"),
      table(["Reason", ["Pools", "num"]], rejections.map(([code, n]) =>
        h("tr", {}, h("td", {}, h("code", {}, code)), h("td", { class: "num" }, n))), "No pool was rejected."),
    ];
  }

  function componentsTable(components) {
    const most = Math.max(1, ...components.map((c) => Math.abs(c.value)));
    return table(["Component", ["Value", "num"], "", "Why"], components.map((c) =>
      h("tr", { "data-component": c.name },
        h("td", { class: "mono" }, c.name),
        h("td", { class: "num" }, num(c.value)),
        h("td", {}, bar(Math.abs(c.value), most, "plain")),
        h("td", {}, c.reason))), "No score components.");
  }

  function decisionSection(placement) {
    const members = placement.members || [];
    const most = Math.max(1, placement.score, ...(placement.alternatives || []).map((a) => a.score));
    return [
      h("h2", {}, "Decision"),
      h("p", {}, "Placed on ", h("strong", { class: "mono" }, placement.poolId),
        ` with a total score of ${num(placement.score)}`,
        members.length > 1 ? ` (gang: ${members.map((m) => `${m.count} on ${m.poolId}`).join(", ")})` : ""),
      componentsTable(placement.components || []),
      h("h3", {}, "Ranked alternatives"),
      table(["Pool", ["Total", "num"], ""], (placement.alternatives || []).map((a) =>
        h("tr", {}, h("td", { class: "mono" }, a.poolId), h("td", { class: "num" }, num(a.score)),
          h("td", {}, bar(a.score, most, "plain")))), "No other pool could take it."),
    ];
  }

  function previewSection(preview, problem, task) {
    const out = [h("h2", {}, "Every candidate now"),
      h("p", { class: "lead" }, "The same pipeline run now on the live ledger (a preview: nothing is reserved).")];
    if (!preview) {
      out.push(h("p", { class: "muted" }, `No preview: ${problem ? `${problem.title}: ${problem.detail}` : "unavailable"}`));
      return out;
    }
    const candidates = preview.candidates || [];
    const most = Math.max(1, ...candidates.map((c) => c.score));
    const names = [...new Set(candidates.flatMap((c) => (c.components || []).map((x) => x.name)))];
    out.push(table(
      ["Pool", ["Total", "num"], "", ...names.map((n) => [n, "num"])],
      candidates.map((c) => {
        const byName = new Map((c.components || []).map((x) => [x.name, x]));
        return h("tr", { "data-candidate": c.poolId },
          h("td", { class: "mono" }, c.poolId, task.placement && task.placement.poolId === c.poolId ? " (placed)" : ""),
          h("td", { class: "num" }, num(c.score)),
          h("td", {}, bar(c.score, most, "plain")),
          names.map((n) => {
            const comp = byName.get(n);
            return h("td", { class: "num", title: comp ? comp.reason : "" }, comp ? num(comp.value) : "—");
          }));
      }),
      "No pool can take this spec now.",
    ));
    const grouped = new Map();
    for (const r of preview.rejected || []) {
      for (const code of r.reasons) {
        if (!grouped.has(code)) grouped.set(code, []);
        grouped.get(code).push(r.poolId);
      }
    }
    out.push(h("h3", {}, "Rejected now, by reason"));
    out.push(table(["Reason", ["Pools", "num"], "Which"],
      [...grouped.entries()].sort((a, b) => b[1].length - a[1].length).map(([code, pools]) =>
        h("tr", { "data-rejection": code }, h("td", {}, h("code", {}, code)),
          h("td", { class: "num" }, pools.length),
          h("td", { class: "mono" }, pools.join(", ")))), "No pool rejects it."));
    return out;
  }

  function leaseSection(task) {
    const leases = task.leases && task.leases.length ? task.leases : task.lease ? [task.lease] : [];
    return [
      h("h2", {}, "Lease"),
      table(["Lease", "Pool", "Runtime instance", "State", ["Epoch", "num"], "Expires", "Revoke by"],
        leases.map((l) => h("tr", {},
          h("td", { class: "mono" }, l.id),
          h("td", { class: "mono" }, l.poolId || "—"),
          h("td", { class: "mono" }, l.runtimeInstanceId),
          h("td", {}, l.state || "ACTIVE"),
          h("td", { class: "num" }, l.epoch),
          h("td", {}, `${when(l.expiresAt)} (${ago(l.expiresAt)})`),
          h("td", {}, l.revokeBy ? when(l.revokeBy) : "—"))),
        "No live lease."),
    ];
  }

  function timeline(events) {
    if (!events.length) return h("p", { class: "empty" }, "No events.");
    return h("ol", { class: "timeline" }, events.map((e) => h("li", {},
      h("time", { datetime: e.at }, when(e.at)),
      h("span", {}, e.fromState ? `${e.fromState} → ${e.toState}` : e.toState, " · ", h("code", {}, e.reason)),
      e.detail ? h("div", { class: "detail mono" }, JSON.stringify(e.detail)) : null)));
  }

  // --- Pools -------------------------------------------------------------------------------

  const STATUS_KIND = { ACTIVE: "ok", CORDONED: "warn", DRAINING: "bad" };

  pages.pools = async () => {
    const pools = await listAll("/v1/pools?limit=200");
    const healthy = pools.filter((p) => p.healthy).length;
    const out = [
      h("h1", {}, "Pools"),
      h("div", { class: "stats" },
        stat(pools.length, "pools"), stat(healthy, "healthy"),
        stat(pools.filter((p) => p.status !== "ACTIVE").length, "cordoned or draining"),
        stat(pools.reduce((n, p) => n + p.activeLeases, 0), "live leases")),
    ];
    if (!pools.length) out.push(h("p", { class: "empty" }, "No pool is visible to this key."));
    else out.push(unitsNote());
    out.push(h("div", { class: "cards" }, pools.map(poolCard)));
    return h("div", {}, out);
  };

  function poolCard(p) {
    const operates = state.role === "admin" || state.role === "operator";
    const util = RESOURCES.map(([k, label, fmt]) => {
      const cap = p.capacity ? p.capacity[k] : 0;
      const used = p.reserved ? p.reserved[k] : 0;
      return [h("span", { class: "k" }, label), bar(used, cap),
        h("span", { class: "v", "data-util": k }, p.capacity ? `${fmt(used)} / ${fmt(cap)}` : "no capacity")];
    });
    return h("article", { class: "card", "data-pool": p.id, "aria-labelledby": `pool-${p.id}` },
      h("h2", { id: `pool-${p.id}` }, p.id),
      h("div", { class: "labels" },
        badge(p.status, STATUS_KIND[p.status] || "info"),
        badge(p.healthy ? "healthy" : "unhealthy", p.healthy ? "ok" : "bad"),
        h("span", { class: "label" }, p.runtimeClass),
        h("span", { class: "label" }, p.region)),
      p.statusReason ? h("p", { class: "status-reason" }, "Reason: ", p.statusReason) : null,
      h("div", { class: "util", role: "group", "aria-label": "Reserved against capacity" }, util),
      p.usageScope === "own" ? h("p", { class: "muted" }, "Reserved: your tenants' share only.") : null,
      h("dl", { class: "kv" },
        h("dt", {}, "Heartbeat"), h("dd", {}, `${ago(p.lastHeartbeatAt)} (${p.runtimeInstanceId})`),
        h("dt", {}, "Live leases"), h("dd", {}, p.activeLeases),
        p.drainProgress ? [h("dt", {}, "Drain"), h("dd", { "data-drain": p.id },
          `${p.drainProgress.leasesLeft} lease(s) left`,
          p.drainDeadline ? `, revoked at ${when(p.drainDeadline)} (${ago(p.drainDeadline)})` : ", no deadline")] : null,
        h("dt", {}, "Labels"), h("dd", {}, labelChips(p.labels))),
      operates ? h("div", { class: "actions" },
        h("button", { type: "button", "data-focus": `cordon-${p.id}`, disabled: p.status === "CORDONED",
          onclick: () => actionDialog(p, "cordon") }, "Cordon"),
        h("button", { type: "button", "data-focus": `drain-${p.id}`, disabled: p.status === "DRAINING",
          onclick: () => actionDialog(p, "drain") }, "Drain…"),
        h("button", { type: "button", "data-focus": `activate-${p.id}`, disabled: p.status === "ACTIVE",
          onclick: () => actionDialog(p, "activate") }, "Activate")) : null);
  }

  const ACTIONS = {
    cordon: ["Cordon", "Running leases stay; the pool takes no new placements."],
    drain: ["Drain", "The pool takes no new placements; with a deadline, leases still running then are revoked and their tasks placed again."],
    activate: ["Activate", "The pool takes new placements again; waiting tasks are woken."],
  };

  async function actionDialog(pool, action) {
    const dialog = $("dialog");
    const [verb, what] = ACTIONS[action];
    const problem = h("div", { class: "problem", role: "alert", hidden: true });
    const reason = h("input", { id: "action-reason", name: "reason", maxlength: "512", placeholder: "optional" });
    const deadline = action === "drain"
      ? h("input", { id: "action-deadline", name: "deadline", type: "datetime-local" }) : null;
    const confirm = h("button", { type: "submit", class: action === "activate" ? "primary" : "danger" },
      `${verb} ${pool.id}`);
    const preview = action === "drain" ? h("div", { id: "drain-preview" }, h("p", { class: "muted" }, "Loading the drain preview…")) : null;
    // The lease-by-lease detail comes after the form, in its own scrolling box, so that the
    // summary and Confirm stay in view however many leases the pool has.
    const details = action === "drain" ? h("div", { id: "drain-details", class: "drain-details" }) : null;
    const form = h("form", { method: "dialog" },
      h("label", { for: "action-reason" }, "Reason", reason),
      deadline ? h("label", { for: "action-deadline" }, "Revoke leases at (your local time)", deadline) : null,
      h("button", { type: "button", onclick: () => dialog.close() }, "Cancel"),
      confirm);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {};
      if (reason.value.trim()) body.reason = reason.value.trim();
      if (deadline && deadline.value) body.deadline = new Date(deadline.value).toISOString();
      confirm.disabled = true;
      try {
        await api("POST", `/v1/pools/${encodeURIComponent(pool.id)}/${action}`,
          Object.keys(body).length ? { body } : {});
        dialog.close();
        await refresh(false);
      } catch (error) {
        problemShow(error, problem);
        confirm.disabled = false;
      }
    });
    dialog.replaceChildren(
      h("h2", { id: "dialog-title" }, `${verb} pool `, h("span", { class: "mono" }, pool.id)),
      h("p", {}, what), preview, problem, form, details);
    dialog.showModal();
    reason.focus();
    if (action === "drain") {
      confirm.disabled = true;
      try {
        const answer = await api("POST", `/v1/pools/${encodeURIComponent(pool.id)}/drain-preview`);
        preview.replaceChildren(...drainSummary(answer.summary));
        details.replaceChildren(...drainItems(answer));
        confirm.disabled = false;
      } catch (error) {
        preview.replaceChildren();
        problemShow(error, problem);
      }
    }
  }

  // Destinations named in the summary; the rest are counted on one line.
  const DRAIN_DESTINATIONS_SHOWN = 8;

  function drainSummary(summary) {
    const out = [
      h("h3", {}, "Where its work would go now"),
      h("p", { "data-summary": "drain" }, summary.leases
        ? `${summary.leases} live lease(s): ${summary.placed} would move, ${summary.waiting} would wait.`
        : "No live lease: nothing would move."),
    ];
    const shown = summary.destinations.slice(0, DRAIN_DESTINATIONS_SHOWN);
    const to = shown.map((d) =>
      h("li", { "data-destination": d.poolId }, h("span", { class: "mono" }, d.poolId), `: ${d.leases} lease(s)`));
    const rest = summary.destinations.slice(shown.length);
    if (rest.length) {
      to.push(h("li", {}, `${rest.length} more pool(s): ${rest.reduce((n, d) => n + d.leases, 0)} lease(s)`));
    }
    if (summary.toPoolsNotShown) {
      to.push(h("li", { "data-destination": "" }, `Pools you cannot see: ${summary.toPoolsNotShown} lease(s)`));
    }
    const waiting = summary.waitingByReason.map((w) =>
      h("li", { "data-waiting": w.code }, h("code", {}, w.code), `: ${w.leases} lease(s)`));
    if (to.length) out.push(h("p", { class: "muted" }, "Would move to"), h("ul", { class: "drain-list" }, to));
    if (waiting.length) out.push(h("p", { class: "muted" }, "Would wait"), h("ul", { class: "drain-list" }, waiting));
    return out;
  }

  function drainItems(answer) {
    const items = answer.items;
    if (!items.length) return [];
    const more = answer.summary.leases - items.length;
    return [
      h("h3", {}, more > 0 ? `The first ${items.length} leases (${more} more)` : "Lease by lease"),
      table(["Task", "Tenant", "Would move to", "Why it would wait"], items.map((i) =>
        h("tr", { "data-lease": i.leaseId },
          h("td", { class: "mono" }, shortId(i.taskId)),
          h("td", { class: "mono" }, i.tenantId),
          h("td", { class: "mono" }, i.members.length || i.membersElsewhere
            ? [...i.members.map((m) => (m.count > 1 ? `${m.poolId} ×${m.count}` : m.poolId)),
              ...(i.membersElsewhere ? [`${i.membersElsewhere} on pools you cannot see`] : [])].join(", ")
            : "—"),
          h("td", {}, i.reason ? [h("code", {}, i.reason.code), " ", i.reason.message] : "")))),
    ];
  }

  // --- Tenants -----------------------------------------------------------------------------

  pages.tenants = async () => {
    const out = [h("h1", {}, "Tenants"),
      h("p", { class: "lead" }, "Quotas per runtime class: what each tenant is guaranteed (nominal), uses, and borrows from its cohort.")];
    let tenants;
    try {
      tenants = await listAll("/v1/tenants?limit=100");
    } catch (error) {
      if (error.status !== 404) throw error;
      out.push(noQuotas("No quotas configured: this Berth has no quotas API."));
      return h("div", {}, out);
    }
    const shown = tenants.filter((t) => Object.keys(t.quotas || {}).length
      || Object.keys(t.usage || {}).length);
    if (!tenants.some((t) => Object.keys(t.quotas || {}).length)) {
      out.push(noQuotas("No quotas configured: every tenant runs without a quota (an admin sets them with PUT /v1/tenants/{tenantId})."));
    }
    if (shown.length) out.push(unitsNote());
    const tree = await cohortTree(tenants);
    if (tree) out.push(tree);
    out.push(h("div", { class: "cards wide" }, shown.map(tenantCard)));
    return h("div", {}, out);
  };

  // The quota tree: each cohort with a bar per managed resource (what its members draw on
  // it against its cap, the part above it borrowed from its parent), its child cohorts and
  // its member tenants nested under it.
  async function cohortTree(tenants) {
    let cohorts;
    try {
      cohorts = await listAll("/v1/cohorts?limit=100");
    } catch (error) {
      if (error.status === 404) return null;
      throw error;
    }
    const ids = new Set(cohorts.map((c) => c.id));
    const inTree = cohorts.filter((c) => c.parent || cohorts.some((x) => x.parent === c.id));
    if (!inTree.length) return null;
    const children = {};
    for (const c of cohorts) {
      if (c.parent && ids.has(c.parent)) (children[c.parent] ||= []).push(c);
    }
    const members = {};
    for (const t of tenants) (members[(t.path || [t.cohort])[0]] ||= []).push(t);
    const node = (c) => h("li", { "data-cohort": c.id },
      h("span", { class: "mono" }, c.id), " ",
      h("span", { class: "muted" }, `weight ${c.fairWeight} · share ${c.share.toFixed(2)}`),
      cohortBars(c),
      h("ul", {}, [...(children[c.id] || []).map(node),
        ...(members[c.id] || []).map((t) => h("li", { class: "mono", "data-member": t.id }, t.id))]));
    const roots = cohorts.filter((c) => !c.parent || !ids.has(c.parent))
      .filter((c) => children[c.id] || inTree.includes(c));
    return h("section", { "aria-labelledby": "cohort-tree" },
      h("h2", { id: "cohort-tree" }, "Cohort tree"),
      h("ul", { class: "tree" }, roots.map(node)));
  }

  function cohortBars(c) {
    const out = [];
    for (const rc of Object.keys(c.usage || {}).sort()) {
      const u = c.usage[rc];
      for (const [k, label, fmt] of RESOURCES) {
        const used = u.used[k] || 0;
        const borrowed = u.borrowed[k] || 0;
        const cap = used - borrowed + (u.lendable[k] || 0);
        if (!used && !cap) continue;
        out.push(h("div", { class: "tree-bar", "data-level": `${c.id}/${rc}/${k}` },
          h("span", { class: "muted" }, `${rc} ${label}`),
          quotaBar(used, cap, borrowed, Math.max(1, used, cap), fmt, "cap")));
      }
    }
    return out;
  }

  function noQuotas(text) {
    return h("p", { class: "closest", "data-empty": "quotas" }, text);
  }

  function quotaBar(used, nominal, borrowed, scale, fmt, word = "nominal") {
    const within = Math.max(0, used - borrowed);
    const own = h("span");
    own.style.width = `${Math.min(100, (100 * within) / scale).toFixed(1)}%`;
    const extra = h("span", { class: "borrowed" });
    extra.style.left = own.style.width;
    extra.style.width = `${Math.min(100, (100 * borrowed) / scale).toFixed(1)}%`;
    const mark = h("i", { class: "nominal" });
    mark.style.left = `${Math.min(100, (100 * nominal) / scale).toFixed(1)}%`;
    return h("div", {
      class: "bar quota", role: "img",
      "aria-label": `${fmt(used)} used of ${fmt(nominal)} ${word}, ${fmt(borrowed)} borrowed`,
    }, own, extra, mark);
  }

  function tenantCard(t) {
    const classes = [...new Set([...Object.keys(t.quotas || {}), ...Object.keys(t.usage || {})])].sort();
    return h("article", { class: "card", "data-tenant": t.id, "aria-labelledby": `tenant-${t.id}` },
      h("h2", { id: `tenant-${t.id}` }, t.id),
      h("p", { class: "muted" }, `cohort ${t.cohort} · fair weight ${t.fairWeight}`),
      classes.map((rc) => {
        const quotas = (t.quotas || {})[rc] || {};
        const usage = (t.usage || {})[rc] || { used: {}, borrowed: {}, borrowable: {} };
        return [h("h3", { class: "mono" }, rc), table(
          ["Resource", ["Nominal", "num"], ["Used", "num"], ["Borrowed", "num"], ["Can borrow now", "num"], ""],
          RESOURCES.map(([k, label, fmt]) => {
            const q = quotas[k];
            const used = (usage.used || {})[k] || 0;
            const borrowed = (usage.borrowed || {})[k] || 0;
            const borrowable = (usage.borrowable || {})[k];
            const nominal = q ? q.nominal : 0;
            const scale = Math.max(1, used, nominal + (borrowable || 0));
            return h("tr", { "data-quota": `${t.id}/${rc}/${k}` },
              h("td", {}, label),
              h("td", { class: "num" }, q ? fmt(q.nominal) : "not limited"),
              h("td", { class: "num" }, fmt(used)),
              h("td", { class: "num" }, fmt(borrowed)),
              h("td", { class: "num" }, borrowable == null ? "—" : fmt(borrowable)),
              h("td", {}, q ? quotaBar(used, nominal, borrowed, scale, fmt) : null));
          }))];
      }));
  }

  // --- start -------------------------------------------------------------------------------

  function start() {
    $("signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      $("key").value = "";
      if (key) signIn(key);
    });
    $("signout").addEventListener("click", () => signedOut(null));
    window.addEventListener("hashchange", () => refresh(true));
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) refresh(false);
    });
    if (state.key) signIn(state.key);
    else signedOut(null);
  }

  start();
})();
