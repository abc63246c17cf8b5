// Baton's console, for operators: the runs view (filters, paging, a run started from it), a
// chart of runs and cost per day and per agent, and beside a run's timeline its tree
// (subagents, a plan's steps), its controls (cancel, follow-up) and "fork here" on an entry.
// Loaded before console.js, whose helpers (el, api, show, badge, money) it calls.
"use strict";

const STATUSES = ["queued", "running", "waiting", "completed", "failed", "expired", "cancelled"];
const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
const CHART_DAYS = 14;
const CHART_PAGES = 10; // at most 1,000 runs drawn; the chart says when there were more
const PALETTE = ["#2456c9", "#0e9384", "#7a5af8", "#d97706", "#be185d", "#4d7c0f", "#0369a1", "#9a3412"];

function ago(iso) {
  const s = Math.max(0, Math.round((Date.now() - new Date(iso)) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.floor(s / 60) + " min ago";
  if (s < 86400) return Math.floor(s / 3600) + " h ago";
  return Math.floor(s / 86400) + " d ago";
}

function duration(ms) {
  if (ms === undefined || ms === null) return "";
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function tokens(spent) { return String(((spent || {}).usage || {}).totalTokens || 0); }

function problem(status, body) {
  return body && body.error ? body.error.message : "status " + status;
}

// A run's state with its details: a plan's steps done of all, what it waits on.
function stateText(r) {
  const d = r.stateDetail || {};
  if (r.state === "executing_plan" && d.total !== undefined) return r.state + " · " + d.done + "/" + d.total + " steps";
  if (r.state === "waiting_on_user" && d.ctaIds) return r.state + " · " + d.ctaIds.length + " question(s)";
  if (r.state === "waiting_on_subagents" && d.subagents) return r.state + " · " + d.subagents.length + " subagent(s)";
  return r.state;
}

// A widget drawn by its kind: a table, a key/value card, else its fallback text, or its JSON.
function widget(kind, data, fallback) {
  if (kind === "table" && data && Array.isArray(data.rows)) {
    const cols = data.columns || [];
    return el("table", {},
      el("thead", {}, el("tr", {}, cols.map((c) => el("th", {}, c)))),
      el("tbody", {}, data.rows.map((r) => el("tr", {}, (Array.isArray(r) ? r : [r]).map((v) =>
        el("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v)))))));
  }
  if ((kind === "card" || kind === "kv") && data && typeof data === "object") {
    return el("dl", { class: "kv" }, Object.entries(data).flatMap(([k, v]) =>
      [el("dt", {}, k), el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
  }
  if (typeof fallback === "string") return el("p", { class: "widget-fallback" }, fallback);
  return json(data);
}

// ---- the runs view ----------------------------------------------------------------------

async function runsView(params) {
  const said = el("p", { class: "outcome", role: "status", "aria-live": "polite" });
  const agents = el("datalist", { id: "agents-seen" });
  show(el("h1", {}, "Runs"), startForm(said, agents), said, filterForm(params), agents,
    el("div", { class: "card", "aria-label": "Runs list" }, runsTable(params, agents)),
    chartCard());
}

// Starts a run; its page opens once it is created.
function startForm(said, agents) {
  const agent = el("input", { type: "text", id: "start-agent", name: "agent", list: "agents-seen",
    placeholder: "the default agent" });
  const prompt = el("textarea", { id: "start-prompt", name: "prompt", required: true });
  const form = el("form", { class: "card", "aria-label": "Start a run" },
    el("h2", {}, "Start a run"),
    el("label", { for: "start-agent" }, "Agent"), agent,
    el("label", { for: "start-prompt" }, "Prompt"), prompt,
    el("button", { type: "submit" }, "Start"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    // The run's page opens on it at once: watched from its creation, its first reply
    // streams there.
    const body = { prompt: prompt.value, watch: true };
    if (agent.value.trim()) body.agent = agent.value.trim();
    const r = await api("/runs", { method: "POST", body });
    if (r.status === 202) location.hash = "#/runs/" + encodeURIComponent(r.body.runId);
    else { said.className = "outcome bad"; said.textContent = "Not started: " + problem(r.status, r.body); }
  });
  return form;
}

// Filters as the page's query: `#/runs?status=…&agent=…&since=YYYY-MM-DD&until=YYYY-MM-DD&owner=…`
// (another owner's runs: an operator's to read).
function filterForm(params) {
  const field = (id, label, input) => el("div", {}, el("label", { for: id }, label), input);
  const status = el("select", { id: "f-status", name: "status" },
    el("option", { value: "" }, "any"), STATUSES.map((s) => el("option", { value: s, selected: params.get("status") === s }, s)));
  const agent = el("input", { type: "text", id: "f-agent", name: "agent", value: params.get("agent") || "" });
  const since = el("input", { type: "date", id: "f-since", name: "since", value: params.get("since") || "" });
  const until = el("input", { type: "date", id: "f-until", name: "until", value: params.get("until") || "" });
  const owner = el("input", { type: "text", id: "f-owner", name: "owner", value: params.get("owner") || "",
    placeholder: "you" });
  const form = el("form", { class: "filter", role: "search", "aria-label": "Filter runs" },
    field("f-status", "Status", status), field("f-agent", "Agent", agent),
    field("f-since", "Created from", since), field("f-until", "Created to", until), field("f-owner", "Owner", owner),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of [["status", status.value], ["agent", agent.value.trim()], ["since", since.value], ["until", until.value], ["owner", owner.value.trim()]]) {
      if (v) q.set(k, v);
    }
    location.hash = "#/runs" + (q.toString() ? "?" + q : "");
  });
  return form;
}

// The API's query for the page's filters: days are whole UTC days, `until` included.
function runsQuery(params) {
  const q = new URLSearchParams();
  if (params.get("status")) q.set("status", params.get("status"));
  for (const k of ["agent", "owner"]) if (params.get(k)) q.set(k, params.get(k));
  if (params.get("since")) q.set("since", params.get("since") + "T00:00:00Z");
  if (params.get("until")) {
    const end = new Date(params.get("until") + "T00:00:00Z");
    if (!isNaN(end)) q.set("until", new Date(end.getTime() + 86400000).toISOString());
  }
  return q;
}

function runsTable(params, agents) {
  const body = el("tbody", {});
  const box = el("div", {}, el("p", {}, "Loading…"));
  const table = el("table", { "aria-label": "Runs" },
    el("thead", {}, el("tr", {}, ["Run", "Agent", "Status", "Created", "Cost", "Tokens"].map((h) => el("th", {}, h)))),
    body);
  const seen = new Set();
  const load = async (cursor, tries) => {
    const q = runsQuery(params);
    q.set("limit", "25");
    if (cursor) q.set("cursor", cursor);
    const { status, body: page } = await api("/runs?" + q);
    if (status !== 200) { box.replaceChildren(el("p", { class: "outcome bad" }, problem(status, page))); return; }
    for (const r of page.runs) {
      if (!seen.has(r.agent)) { seen.add(r.agent); agents.append(el("option", { value: r.agent })); }
      body.append(el("tr", { "data-run": r.runId },
        el("td", {}, el("a", { href: "#/runs/" + encodeURIComponent(r.runId) }, r.runId),
          r.prompt ? el("small", { class: "prompt" }, r.prompt) : null),
        el("td", {}, r.agent), el("td", {}, badge(r.status)),
        el("td", { title: r.createdAt }, ago(r.createdAt)),
        el("td", {}, money(r.total.costUsd)), el("td", {}, tokens(r.total))));
    }
    // A filtered page may keep none of the runs it read: read on a little before asking.
    if (page.nextCursor && !page.runs.length && tries < 5) return load(page.nextCursor, tries + 1);
    const parts = [body.children.length ? table : el("p", {}, "No runs match.")];
    if (page.nextCursor) {
      const more = el("button", { type: "button", class: "more" }, "More runs");
      more.addEventListener("click", () => { more.disabled = true; load(page.nextCursor, 0); });
      parts.push(more);
    }
    box.replaceChildren(...parts);
  };
  load(null, 0);
  return box;
}

// ---- the chart: runs and cost per day, by agent -----------------------------------------

function chartCard() {
  const card = el("section", { class: "card", "aria-label": "Runs and cost per day" },
    el("h2", {}, "Last " + CHART_DAYS + " days"), el("p", {}, "Loading…"));
  drawChart(card);
  return card;
}

async function drawChart(card) {
  const today = new Date(new Date().toISOString().slice(0, 10) + "T00:00:00Z");
  const first = new Date(today.getTime() - (CHART_DAYS - 1) * 86400000);
  const days = [...Array(CHART_DAYS).keys()].map((i) => new Date(first.getTime() + i * 86400000).toISOString().slice(0, 10));
  const by = new Map(); // agent → { runs: Map(day → n), cost: Map(day → usd), tokens }
  let cursor = null, partial = false;
  for (let i = 0; ; i++) {
    if (i === CHART_PAGES) { partial = true; break; }
    const q = new URLSearchParams({ since: first.toISOString(), limit: "100" });
    if (cursor) q.set("cursor", cursor);
    const { status, body } = await api("/runs?" + q);
    if (status !== 200) { card.lastChild.replaceWith(el("p", { class: "outcome bad" }, problem(status, body))); return; }
    for (const r of body.runs) {
      const day = r.createdAt.slice(0, 10);
      const a = by.get(r.agent) || { runs: new Map(), cost: new Map(), n: 0, usd: 0, tokens: 0 };
      a.runs.set(day, (a.runs.get(day) || 0) + 1);
      a.cost.set(day, (a.cost.get(day) || 0) + r.total.costUsd);
      a.n += 1; a.usd += r.total.costUsd; a.tokens += Number(tokens(r.total));
      by.set(r.agent, a);
    }
    cursor = body.nextCursor;
    if (!cursor) break;
  }
  const agents = [...by.keys()].sort();
  const color = new Map(agents.map((a, i) => [a, PALETTE[i % PALETTE.length]]));
  const legend = el("table", { "aria-label": "By agent" },
    el("thead", {}, el("tr", {}, ["Agent", "Runs", "Cost", "Tokens"].map((h) => el("th", {}, h)))),
    el("tbody", {}, agents.map((a) => el("tr", {},
      el("td", {}, el("span", { class: "swatch", "data-color": color.get(a) }), a),
      el("td", {}, String(by.get(a).n)), el("td", {}, money(by.get(a).usd)), el("td", {}, String(by.get(a).tokens))))));
  for (const s of legend.querySelectorAll(".swatch")) s.append(svg("svg", { width: 10, height: 10 }, svg("rect", { width: 10, height: 10, fill: s.dataset.color })));
  card.replaceChildren(...kids(el("h2", {}, "Last " + CHART_DAYS + " days"),
    bars("Runs per day", days, agents, color, (a, d) => by.get(a).runs.get(d) || 0, String),
    bars("Cost per day", days, agents, color, (a, d) => by.get(a).cost.get(d) || 0, money),
    legend, partial ? el("p", { class: "live" }, "Only the newest " + CHART_PAGES * 100 + " runs are drawn.") : null));
}

function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// Stacked bars, one per day, a segment per agent; each segment titled with its figures.
function bars(title, days, agents, color, value, fmt) {
  const W = 640, H = 150, pad = 18, bw = (W - 2 * pad) / days.length;
  const totals = days.map((d) => agents.reduce((s, a) => s + value(a, d), 0));
  const top = Math.max(...totals, 0) || 1;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H + 20}`, role: "img", class: "chart",
    "aria-label": title + ": " + days.map((d, i) => d + " " + fmt(totals[i])).join(", ") });
  days.forEach((d, i) => {
    let y = H;
    for (const a of agents) {
      const v = value(a, d);
      if (!v) continue;
      const h = Math.max(1, (v / top) * (H - pad));
      y -= h;
      chart.append(svg("rect", { class: "bar", x: pad + i * bw + 2, y, width: bw - 4, height: h, fill: color.get(a) },
        svg("title", {}, `${d} · ${a}: ${fmt(v)}`)));
    }
    if (i % 2 === 0) chart.append(svg("text", { x: pad + i * bw + bw / 2, y: H + 14, "text-anchor": "middle", "font-size": 10 }, d.slice(5)));
  });
  chart.append(svg("text", { x: pad, y: 10, "font-size": 10 }, "max " + fmt(top)));
  return el("figure", {}, el("figcaption", {}, title), chart);
}

// ---- beside a run's timeline: controls and its tree -------------------------------------

// The run page's side: cancel, a follow-up, and the tree. `plans()` gives the run's plan
// entries as the timeline drew them; `update(run)` redraws after the run moved.
function runSide(runId, plans, announce) {
  const cancel = el("button", { type: "button", class: "reject" }, "Cancel run");
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    const r = await api(`/runs/${encodeURIComponent(runId)}/cancel`, { method: "POST" });
    announce(r.status === 202 ? "ok" : "bad", r.status === 202 ? "Cancel sent: the run stops in its turn." : "Not cancelled: " + problem(r.status, r.body));
  });
  const text = el("textarea", { id: "follow-up", name: "text", required: true });
  const follow = el("form", { "aria-label": "Follow-up" },
    el("label", { for: "follow-up" }, "Follow-up message"), text, el("button", { type: "submit" }, "Send follow-up"));
  follow.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await api(`/runs/${encodeURIComponent(runId)}/messages`, { method: "POST", body: { text: text.value, watch: true } });
    if (r.status === 202) text.value = "";
    announce(r.status === 202 ? "ok" : "bad", r.status === 202 ? "Sent: the run takes it in its turn." : "Not sent: " + problem(r.status, r.body));
  });
  const tree = el("section", { class: "card tree", "aria-label": "Run tree" }, el("h2", {}, "Tree"), el("p", {}, "Loading…"));
  const side = el("aside", { class: "side" }, el("section", { class: "card", "aria-label": "Controls" }, cancel, follow), tree);
  let last = 0, timer = null;
  const refresh = async () => {
    last = Date.now();
    const { status, body } = await api(`/runs/${encodeURIComponent(runId)}/tree`).catch(() => ({ status: 0 }));
    if (status === 200) tree.replaceChildren(el("h2", {}, "Tree"), drawTree(body, plans()));
  };
  const update = (run) => {
    cancel.hidden = TERMINAL.has(run.status);
    // At most one read of the tree every two seconds, however fast the run moves.
    if (timer) return;
    timer = setTimeout(() => { timer = null; refresh(); }, Math.max(0, 2000 - (Date.now() - last)));
  };
  refresh();
  return { node: side, update };
}

function treeRow(n, label) {
  return el("div", { class: "node" }, label ? el("span", { class: "kind" }, label + " ") : null,
    el("a", { href: "#/runs/" + encodeURIComponent(n.runId) }, n.agent), " ", badge(n.status),
    el("span", { class: "meta" }, money(n.total.costUsd) + " · " + tokens(n.total) + " tokens · " + duration(n.workedMs)));
}

// The run, its plans' steps (from its timeline: a step not started has no run yet) and the
// runs under it, nested by parent.
function drawTree(t, plans) {
  const kids = new Map();
  for (const n of t.descendants) {
    const k = n.parent.runId;
    if (!kids.has(k)) kids.set(k, []);
    kids.get(k).push(n);
  }
  const byId = new Map(t.descendants.map((n) => [n.runId, n]));
  const planCalls = new Set(plans.map((p) => p.id));
  const under = (runId, top) => {
    const items = [];
    if (top) {
      for (const p of plans) {
        const steps = Object.entries(p.plan.steps || {});
        const done = steps.filter(([, s]) => !["pending", "running"].includes(s.status)).length;
        items.push(el("li", { class: "plan" }, el("div", { class: "node" }, el("span", { class: "kind" }, "plan "), done + "/" + steps.length + " steps"),
          el("ul", {}, steps.map(([id, s]) => {
            const n = s.childRunId && byId.get(s.childRunId);
            return el("li", { class: "step", "data-step": id },
              el("div", { class: "node" }, el("span", { class: "kind" }, "step "), el("strong", {}, id), " ", badge(s.status),
                s.durationMs !== undefined ? el("span", { class: "meta" }, duration(s.durationMs)) : null),
              n ? el("ul", {}, el("li", {}, treeRow(n, "run"), under(n.runId, false))) : null);
          }))));
      }
    }
    for (const n of kids.get(runId) || []) {
      if (top && planCalls.has(n.parent.toolCallId)) continue; // drawn under its step
      items.push(el("li", { class: "subagent" }, treeRow(n, "subagent"), under(n.runId, false)));
    }
    return items.length ? el("ul", {}, items) : null;
  };
  return el("ul", { class: "tree-root" }, el("li", {}, treeRow(t.run, null), under(t.run.runId, true)),
    t.truncated ? el("li", { class: "live" }, "More runs are under it than shown.") : null);
}

// ---- fork here --------------------------------------------------------------------------

// "Fork here" on an entry a fork can start at: a user turn (its text, edited), a reply
// (thought again), a settled question (answered anew; a pending one has its own form). The
// fork's page opens once it is created.
function forkHere(e, runId) {
  const ask = e.type === "tool" && e.cta && e.cta.status !== "pending";
  if (!["user", "assistant"].includes(e.type) && !ask) return [];
  const said = el("p", { class: "outcome", role: "status" });
  const send = async (replacement) => {
    const body = { atSeq: e.seq };
    if (replacement) body.replacement = replacement;
    const r = await api(`/runs/${encodeURIComponent(runId)}/fork`, { method: "POST", body });
    if (r.status === 202) location.hash = "#/runs/" + encodeURIComponent(r.body.runId);
    else { said.className = "outcome bad"; said.textContent = "Not forked: " + problem(r.status, r.body); }
    return r;
  };
  const box = el("details", { class: "fork" }, el("summary", {}, "Fork here"));
  if (e.type === "user") {
    const id = "fork-text-" + e.seq;
    const text = el("textarea", { id, name: "text" });
    text.value = e.text;
    const form = el("form", { "aria-label": "Fork at #" + e.seq }, el("label", { for: id }, "The turn's text in the fork"), text,
      el("button", { type: "submit" }, "Fork"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); send({ text: text.value }); });
    box.append(form);
  } else if (e.type === "assistant") {
    const go = el("button", { type: "button" }, "Fork and think again");
    go.addEventListener("click", () => send(null));
    box.append(go);
  } else {
    box.append(el("p", {}, "Answer the question anew in a fork:"),
      answerForm(Object.assign({}, e.cta, { ctaId: "fork-" + e.seq }), (answer) => send({ response: answer }), () => {}));
  }
  box.append(said);
  return [box];
}
