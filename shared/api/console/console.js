// Baton's console: the inbox of pending CTAs, typed answer forms, a run page with a live
// timeline, and one-time answer links (the runs view, a run's tree and forks: runs.js). Plain JavaScript, no build step; every piece of data
// goes into the page as text (never as HTML).
"use strict";

const app = document.getElementById("app");
const TOKEN_KEY = "baton.token";
let leave = () => {}; // stops what the current page runs (a stream, a poll)

// ---- the API --------------------------------------------------------------------------

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path, options = {}) {
  const headers = Object.assign({ "Accept": "application/json" }, options.headers || {});
  if (options.auth !== false && token()) headers["Authorization"] = "Bearer " + token();
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method: options.method || "GET", headers, signal: options.signal,
    body: options.body === undefined ? undefined : JSON.stringify(options.body) });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (r.status === 401 && options.auth !== false) {
    sessionStorage.removeItem(TOKEN_KEY);
    render();
    throw new Error("signed out");
  }
  return { status: r.status, body };
}

// ---- small DOM helpers ----------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Nodes to put in a parent: DOM methods would turn a null into the text "null".
function kids(...xs) { return xs.flat().filter((x) => x !== null && x !== undefined && x !== false); }
function badge(text) { return el("span", { class: "badge " + text }, text); }
function json(v) { return el("pre", {}, JSON.stringify(v, null, 2)); }
function show(...nodes) { app.replaceChildren(...kids(nodes)); app.focus(); }

function timeLeft(iso) {
  let s = Math.round((new Date(iso) - Date.now()) / 1000);
  if (s <= 0) return "expired";
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60);
  if (d) return `${d} d ${h} h left`;
  if (h) return `${h} h ${m} min left`;
  return `${Math.max(m, 1)} min left`;
}

function money(usd) { return usd ? "$" + usd.toFixed(4) : "$0"; }

// ---- answering ------------------------------------------------------------------------

// What an answer's reply means, in words.
function outcome(status, body) {
  const code = body && body.error && body.error.code;
  if (status === 202) return ["ok", "Accepted: the run takes your answer in its turn."];
  if (code === "cta_answered") return ["bad", "Already answered: this question was settled before your answer."];
  if (code === "link_used") return ["bad", "This link was already used: the question is answered."];
  if (code === "cta_cancelled") return ["bad", "Cancelled: the run ended before your answer."];
  if (status === 410) return ["bad", "Expired: the question stopped waiting for an answer."];
  const msg = (body && body.error && body.error.message) || "status " + status;
  return ["bad", "Not accepted: " + msg];
}

// A typed form for `cta`; `send(answer)` posts it and resolves to {status, body}. The
// outcome is said under the form, or by `announce` (a page whose timeline redraws the form).
function answerForm(cta, send, announce) {
  const said = announce ? null : el("p", { class: "outcome", role: "status", "aria-live": "polite" });
  const form = el("form", { "aria-label": "Answer" });
  const finish = async (answer) => {
    for (const b of form.querySelectorAll("button, textarea")) b.disabled = true;
    const { status, body } = await send(answer);
    const [tone, words] = outcome(status, body);
    if (announce) announce(tone, words);
    else {
      said.className = "outcome " + tone;
      said.textContent = words;
    }
    const code = body && body.error && body.error.code;
    if (tone === "bad" && (status === 400 || code === "answer_mismatch")) {
      for (const b of form.querySelectorAll("button, textarea")) b.disabled = false;
    }
  };
  const id = cta.ctaId;
  if (cta.kind === "approval") {
    const reason = el("textarea", { id: "reason-" + id, name: "reason" });
    // A budget question: approving raises the budget by what it asks, or by this.
    const raise = cta.budget ? el("input", {
      id: "raise-" + id, name: "raiseUsd", type: "number", min: "0.0001", step: "any",
      placeholder: String(cta.budget.askUsd),
    }) : null;
    form.append(
      el("label", { for: "reason-" + id }, "Reason (optional)"), reason,
      ...(raise ? [el("label", { for: "raise-" + id }, "Raise by, in US dollars (optional)"), raise] : []),
      el("button", { type: "submit", value: "approve" }, "Approve"),
      el("button", { type: "submit", value: "reject", class: "reject" }, "Reject"),
    );
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const approved = (ev.submitter && ev.submitter.value) !== "reject";
      const answer = { kind: "approval", approved };
      if (reason.value.trim()) answer.reason = reason.value.trim();
      if (approved && raise && raise.value) answer.raiseUsd = Number(raise.value);
      finish(answer);
    });
  } else if (cta.kind === "text") {
    const text = el("textarea", {
      id: "text-" + id, name: "text", placeholder: cta.placeholder || "",
      required: cta.required ? true : undefined,
    });
    form.append(
      el("label", { for: "text-" + id }, cta.required ? "Your answer (required)" : "Your answer"),
      text, el("button", { type: "submit" }, "Send"),
    );
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      finish({ kind: "text", text: text.value });
    });
  } else if (cta.kind === "choice") {
    const group = el("div", { role: "group", "aria-label": cta.prompt });
    for (const o of cta.options || []) {
      group.append(el("button", { type: "submit", value: o.id, class: "option" },
        o.label, o.description ? el("small", {}, o.description) : null));
    }
    form.append(group);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      finish({ kind: "choice", selectedId: ev.submitter && ev.submitter.value });
    });
  }
  return el("div", {}, form, said);
}

function question(cta) { return cta.message || cta.prompt || ""; }

// How a plan's review came out: the reviewer's verdict and notes, a person's, or an answer
// given in the conversation.
function planReview(r) {
  const who = { agent: "The plan reviewer", human: "A person", conversation: "The person, in the conversation," }[r.by] || r.by;
  const said = { approved: "approved the plan", sent_back: "sent the plan back", rejected: "rejected the plan",
    answered_in_conversation: "answered instead of the question; the agent read it" }[r.outcome] || r.outcome;
  const p = el("p", { class: "review", "aria-label": "Plan review" }, "Review: ", el("strong", {}, who + " " + said));
  if (r.notes) p.append(" — ", el("q", {}, r.notes));
  if (r.reviewerRunId) {
    p.append(" (", el("a", { href: "#/runs/" + encodeURIComponent(r.reviewerRunId) }, "the review"), ")");
  }
  return p;
}

// What the human should know besides the question: the gated call, the placeholder.
function context(cta) {
  const parts = [];
  if (cta.gated) {
    parts.push(el("p", {}, "Gates ", el("code", {}, cta.gated.tool),
      cta.gated.reason ? " — " + cta.gated.reason : ""));
    parts.push(json(cta.gated.input));
  }
  if (cta.budget) parts.push(budgetAsked(cta.budget));
  return parts;
}

// A budget question's figures.
function budgetAsked(b) {
  return el("p", { class: "meta" }, "Budget: spent ", money(b.spentUsd), " of ",
    money(b.budgetUsd), " · approving adds ", money(b.askUsd), " beyond what it has spent");
}

// Answered here, and recorded as given through the console.
function postAnswer(cta) {
  return (answer) => api(`/ctas/${encodeURIComponent(cta.ctaId)}/response`,
    { method: "POST", body: answer, headers: { "X-Baton-Via": "console" } });
}

// Who a question is for, and how many approvals it still needs.
function assignment(cta) {
  if (!cta.assignees || !cta.assignees.length) return null;
  const need = cta.requiredApprovals > 1
    ? ` · ${(cta.approvals || []).length} of ${cta.requiredApprovals} approvals` : "";
  return el("p", { class: "meta" }, "For ", cta.assignees.join(", "), need);
}

// A question's history, read when opened (GET /ctas/{id}/audit).
function history(cta) {
  const list = el("ol", { class: "audit" });
  const box = el("details", { class: "history" }, el("summary", {}, "History"), list);
  box.addEventListener("toggle", async () => {
    if (!box.open || list.childElementCount) return;
    const { status, body } = await api(`/ctas/${encodeURIComponent(cta.ctaId)}/audit`);
    if (status !== 200) { list.append(el("li", {}, "status " + status)); return; }
    for (const e of body.events || []) {
      const who = [e.by && "by " + e.by, e.via && "via " + e.via, e.channel && "through " + e.channel,
        e.recipient && "to " + e.recipient, e.outcome, e.detail].filter(Boolean).join(" · ");
      list.append(el("li", {}, el("time", { datetime: e.at }, new Date(e.at).toLocaleString()), " ",
        el("strong", {}, e.type), who ? " — " + who : ""));
    }
  });
  return box;
}

// ---- pages ----------------------------------------------------------------------------

function signIn() {
  const input = el("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true });
  const form = el("form", { class: "card", "aria-label": "Sign in" },
    el("h1", {}, "Sign in"),
    el("p", {}, "Paste your token: the dev token `baton dev` printed (it is in .baton/token), or on AWS the JWT your identity provider issued. It is kept for this tab only."),
    el("label", { for: "token" }, "Token"), input,
    el("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    render();
  });
  show(form);
  input.focus();
}

async function inbox(params) {
  const run = params.get("run") || "";
  const filter = el("input", { type: "text", id: "run-filter", name: "run", value: run, placeholder: "run_…" });
  const form = el("form", { class: "filter", role: "search" },
    el("div", {}, el("label", { for: "run-filter" }, "Only under run"), filter),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = filter.value.trim() ? "#/inbox?run=" + encodeURIComponent(filter.value.trim()) : "#/inbox";
  });
  const list = el("div", { "aria-live": "polite" }, el("p", {}, "Loading…"));
  show(el("h1", {}, "Waiting for you"), form, list);
  const q = "/ctas?status=pending&limit=50" + (run ? "&rootRunId=" + encodeURIComponent(run) : "");
  // Oldest first, a page at a time: each CTA carries its run's agent and prompt, so a page
  // is one request, however many wait.
  const page = async (cursor) => {
    const { status, body } = await api(q + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    if (status !== 200) {
      list.replaceChildren(el("p", { class: "outcome bad" }, body && body.error ? body.error.message : "status " + status));
      return;
    }
    const ctas = body.ctas || [];
    if (!cursor && !ctas.length) {
      list.replaceChildren(el("p", {}, "Nothing waits for you."));
      return;
    }
    const cards = ctas.map((cta) => el("article", { class: "card", "aria-label": question(cta) },
      el("h2", {}, question(cta)),
      el("div", { class: "meta" },
        badge(cta.kind),
        el("span", {}, "agent ", el("strong", {}, cta.agent || "?")),
        el("a", { href: "#/runs/" + encodeURIComponent(cta.runId) }, "run " + cta.runId),
        el("span", {}, timeLeft(cta.expiresAt))),
      cta.runPrompt ? el("p", {}, el("span", { class: "kind" }, "Prompt "), cta.runPrompt) : null,
      assignment(cta),
      context(cta),
      fallback(cta),
      answerForm(cta, postAnswer(cta)),
      history(cta)));
    if (cursor) list.lastChild.remove(); else list.replaceChildren();
    list.append(...cards);
    if (body.nextCursor) {
      const more = el("button", { type: "button", class: "more" }, "More");
      more.addEventListener("click", () => { more.disabled = true; page(body.nextCursor); });
      list.append(more);
    }
  };
  // The questions assigned to you (by name or by group) in other people's runs, asked for
  // beside your own: their runs are theirs, so no link to them.
  const assignedToYou = run ? null : api("/ctas?assigned=me&status=pending&limit=50");
  await page(null);
  if (!assignedToYou) return;
  const mine = await assignedToYou;
  const others = (mine.body && mine.body.ctas) || [];
  if (mine.status !== 200 || !others.length) return;
  const assigned = el("section", { "aria-label": "Assigned to you" }, el("h2", {}, "Assigned to you"),
    ...others.map((cta) => el("article", { class: "card", "aria-label": question(cta) },
      el("h2", {}, question(cta)),
      el("div", { class: "meta" }, badge(cta.kind),
        el("span", {}, "agent ", el("strong", {}, cta.agent || "?")),
        el("span", {}, timeLeft(cta.expiresAt))),
      assignment(cta), context(cta), fallback(cta),
      answerForm(cta, postAnswer(cta)), history(cta))));
  list.after(assigned);
}

// What a question with a default takes if no one answers in time (when its run expires
// questions into their defaults).
function fallback(cta) {
  const d = cta.default;
  if (!d) return null;
  let said;
  if (d.kind === "approval") said = (d.approved ? "approved" : "rejected") + (d.reason ? ` (${d.reason})` : "");
  else if (d.kind === "text") said = `“${d.text}”`;
  else {
    const o = (cta.options || []).find((o) => o.id === d.selectedId);
    said = o ? o.label : d.selectedId;
  }
  return el("p", { class: "meta" }, el("span", { class: "kind" }, "If unanswered "), said);
}

// Downloads a run's file: the route needs the token, so the page fetches it and hands the
// bytes to the browser as a download.
async function download(runId, f) {
  const r = await fetch(`/runs/${encodeURIComponent(runId)}/files/${encodeURIComponent(f.fileId)}?link=1`,
    { headers: { "Authorization": "Bearer " + token() } });
  if (!r.ok) return;
  // A large file on AWS: a short-lived link to S3, which names it as a download.
  if (r.headers.get("content-type") === "application/vnd.baton.file-link+json") {
    location.assign((await r.json()).url);
    return;
  }
  const url = URL.createObjectURL(await r.blob());
  const a = el("a", { href: url, download: f.name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// One timeline entry, as a list item (`announce` says how an answer given here went).
function entryItem(e, announce, runId) {
  const li = el("li", { class: e.type, "data-seq": e.seq });
  const head = el("div", { class: "kind" }, e.type + " · #" + e.seq);
  li.append(head);
  switch (e.type) {
    case "user":
    case "queued":
      // A hidden turn (`visible: false`) is drawn, but only shown on asking.
      if (e.visible === false) { li.classList.add("unlisted"); head.append(" · hidden"); }
      if (e.trigger) head.append(" · trigger ", el("code", {}, e.trigger));
      if (e.tier) head.append(" · tier " + e.tier);
      li.append(el("p", {}, e.text));
      break;
    case "assistant":
      head.append(" · " + (e.operation || "think") + (e.model ? " · " + e.model : "") +
        (e.costUsd ? " · " + money(e.costUsd) : ""));
      if (e.text) li.append(el("p", {}, e.text));
      if (e.truncated) {
        li.append(el("p", { class: "outcome bad" },
          "Cut at the model's output limit (" + (e.stopReason || "length") + ")"));
      }
      break;
    case "tool": {
      head.append(" · ", el("code", {}, e.name), " ", badge(e.result.status),
        e.durationMs !== undefined ? " · " + e.durationMs + " ms" : "");
      li.append(el("details", {}, el("summary", {}, "input"), json(e.input)));
      if (e.result.status === "success") li.append(el("div", { class: "kind" }, "result"), json(e.result.output));
      if (e.result.status === "error") li.append(el("p", { class: "outcome bad" }, e.result.error));
      if (e.result.status === "pending") li.append(el("p", { class: "live" }, e.result.reason));
      if (e.childRunId) {
        li.append(el("p", {}, "Subagent: ", el("a", { href: "#/runs/" + encodeURIComponent(e.childRunId) }, e.childRunId)));
      }
      if (e.plan && e.plan.steps) {
        const rows = Object.entries(e.plan.steps).map(([id, s]) => el("tr", {},
          el("td", {}, id), el("td", {}, badge(s.status)),
          el("td", {}, s.childRunId ? el("a", { href: "#/runs/" + encodeURIComponent(s.childRunId) }, s.childRunId) : ""),
          el("td", {}, s.error || "")));
        li.append(el("table", { "aria-label": "Plan steps" },
          el("thead", {}, el("tr", {}, el("th", {}, "step"), el("th", {}, "status"), el("th", {}, "run"), el("th", {}, "error"))),
          el("tbody", {}, rows)));
      }
      if (e.plan && e.plan.review) li.append(planReview(e.plan.review));
      if (e.cta) {
        const c = e.cta;
        li.append(el("p", {}, "Asks: ", el("strong", {}, question(c)), " ", badge(c.status)));
        if (c.budget) li.append(budgetAsked(c.budget));
        if (c.response) li.append(el("p", {}, "Answer: "), json(c.response));
        if (c.status === "pending") li.append(answerForm(c, postAnswer(c), announce));
      }
      break;
    }
    case "widget":
      head.append(" · " + e.kind);
      li.append(widget(e.kind, e.data, e.fallback));
      break;
    case "usage":
      li.append(el("p", { "aria-label": "Turn usage" }, "The turn from #" + e.turnSeq + " used " +
        e.usage.totalTokens + " tokens (" + e.usage.inputTokens + " in, " + e.usage.outputTokens +
        " out), " + money(e.costUsd) + ", its subagents included"));
      break;
    case "file": {
      const link = el("a", { href: "#", class: "file" }, "Download " + e.name);
      link.addEventListener("click", (ev) => { ev.preventDefault(); download(runId, e); });
      head.append(" · " + e.mediaType + " · " + e.size + " bytes");
      li.append(el("p", {}, link), el("p", {}, e.summary));
      break;
    }
    default:
      li.append(el("p", {}, (e.code ? e.code + ": " : "") + (e.message || "")));
  }
  return li;
}

async function runPage(runId) {
  const header = el("section", { class: "card", "aria-label": "Run" }, el("p", {}, "Loading…"));
  const list = el("ol", { class: "timeline", "aria-label": "Timeline", "aria-live": "polite" });
  const live = el("p", { class: "live" });
  const said = el("p", { class: "outcome", role: "status", "aria-live": "polite" });
  const announce = (tone, words) => {
    said.className = "outcome " + tone;
    said.textContent = words;
  };
  const reveal = el("input", { type: "checkbox", onchange: (ev) => list.classList.toggle("reveal", ev.target.checked) });
  const plans = new Map(); // the plan entries as last drawn, for the tree beside
  const side = runSide(runId, () => [...plans.values()], announce);
  show(el("h1", {}, "Run ", el("code", {}, runId)), header, said, el("div", { class: "beside" },
    el("div", {}, live, el("label", {}, reveal, " Show hidden turns"), list), side.node));
  const items = new Map();
  const drawn = new Map(); // seq → the entry as last drawn (a form is redrawn only on change)
  // What a step shows before it commits: a reply as it streams ("r" + seq), a tool call as
  // it runs ("t" + call id). The committed entry replaces it.
  const drafts = new Map();
  const drop = (key) => {
    const d = drafts.get(key);
    if (d) { d.li.remove(); drafts.delete(key); }
  };
  const committedCalls = new Set();
  const onLive = (event, v) => {
    // A piece that comes after its step committed (the AWS channel lags the timeline): the
    // entry is drawn already.
    if ((event === "delta" || event === "tool_call_delta") && drawn.has(v.seq)) return;
    if ((event === "tool_started" || event === "tool_finished") && committedCalls.has(v.callId)) return;
    if (event === "delta") {
      let d = drafts.get("r" + v.seq);
      if (!d || d.attempt !== v.attempt) {
        drop("r" + v.seq); // a call tried again starts over
        const p = el("p", {});
        const li = el("li", { class: "assistant streaming", "data-seq": v.seq },
          el("div", { class: "kind" }, "assistant · #" + v.seq + " · writing…"), p);
        list.append(li);
        d = { li, p, attempt: v.attempt };
        drafts.set("r" + v.seq, d);
      }
      d.p.textContent += v.text;
    } else if (event === "tool_started") {
      const state = el("span", { class: "badge running" }, "running");
      const li = el("li", { class: "tool running", "data-call": v.callId },
        el("div", { class: "kind" }, "tool · ", el("code", {}, v.tool), " ", state),
        el("p", {}, el("code", {}, v.inputPreview)));
      list.append(li);
      drafts.set("t" + v.callId, { li, state });
    } else if (event === "tool_finished") {
      const d = drafts.get("t" + v.callId);
      if (d) {
        d.li.classList.remove("running");
        d.state.className = "badge " + (v.ok ? "success" : "error");
        d.state.textContent = (v.ok ? "done" : "failed") + " in " + v.durationMs + " ms";
      }
    } else if (event === "state") {
      const d = v.detail || {};
      live.textContent = "Live · " + v.state +
        (d.iteration !== undefined ? " · iteration " + d.iteration : "") + (d.model ? " · " + d.model : "");
    }
  };
  const put = (e) => {
    if (e.type === "assistant") drop("r" + e.seq);
    if (e.type === "tool" && e.result.status !== "pending") {
      drop("t" + e.id);
      committedCalls.add(e.id);
    }
    const text = JSON.stringify(e);
    if (drawn.get(e.seq) === text) return;
    drawn.set(e.seq, text);
    const li = entryItem(e, announce, runId);
    if (e.plan) plans.set(e.seq, e);
    if (!first.body.parent) li.append(...forkHere(e, runId)); // a subagent's run is not forked
    const old = items.get(e.seq);
    if (old) old.replaceWith(li);
    else {
      const after = [...items.keys()].filter((s) => s < e.seq).sort((a, b) => b - a)[0];
      if (after === undefined) list.prepend(li); else items.get(after).after(li);
    }
    items.set(e.seq, li);
  };
  const summary = (r) => {
    side.update(r);
    header.replaceChildren(...kids(
      el("div", { class: "meta" }, badge(r.status), r.state ? el("span", {}, stateText(r)) : null,
        r.agent ? el("span", {}, "agent ", el("strong", {}, r.agent)) : null,
        r.parent ? el("a", { href: "#/runs/" + encodeURIComponent(r.parent.runId) }, "parent run") : null),
      el("p", {}, "Tokens: ", String((r.usage || {}).totalTokens || 0),
        " · cost ", money(r.costUsd), r.total ? " · with subagents " + money(r.total.costUsd) : ""),
      r.budget ? el("p", { class: "budget" }, "Budget: spent ", money(r.budget.spentUsd), " of ",
        money(r.budget.budgetUsd),
        r.budget.raises.length ? ` (raised ${r.budget.raises.length}×, by ` +
          r.budget.raises.map((x) => money(x.byUsd)).join(", ") + ")" : "") : null,
      r.result ? el("p", {}, el("strong", {}, "Result: "), r.result) : null,
      r.error ? el("p", { class: "outcome bad" }, r.error.code + ": " + r.error.message) : null));
  };
  const first = await api(`/runs/${encodeURIComponent(runId)}`);
  if (first.status !== 200) {
    header.replaceChildren(el("p", { class: "outcome bad" }, first.body && first.body.error ? first.body.error.message : "status " + first.status));
    return;
  }
  summary(first.body);
  const stop = new AbortController();
  leave = () => stop.abort();
  follow(runId, stop.signal, put, (r) => summary(Object.assign(first.body, r)), live, onLive);
}

// Why a one-time link opens no form, by the refusal's code (`GET /links/{token}`).
const LINK_REFUSED = new Map([
  ["link_used", "This link was already used: the question is answered."],
  ["cta_answered", "This question was already answered: it needs no answer from this link."],
  ["cta_cancelled", "This question was cancelled: its run ended before it was answered."],
  ["link_expired", "This link has expired: the question stopped waiting for an answer."],
]);

async function linkPage(tokenText) {
  const box = el("section", { class: "card" }, el("p", {}, "Loading…"));
  show(el("h1", {}, "A question for you"), box);
  const path = "/links/" + encodeURIComponent(tokenText);
  const { status, body } = await api(path, { auth: false });
  if (status !== 200) {
    const code = body && body.error && body.error.code;
    const words = LINK_REFUSED.get(code) || (status === 410 ? LINK_REFUSED.get("link_expired")
      : status === 403 ? "This link is not valid. Ask for a new one."
      : "This link cannot be opened now (status " + status + "). Try again later.");
    box.replaceChildren(el("p", { class: "outcome bad", role: "alert" }, words));
    return;
  }
  box.replaceChildren(...kids(el("h2", {}, question(body)),
    el("p", { class: "meta" }, badge(body.kind), el("span", {}, timeLeft(body.expiresAt))),
    context(body),
    fallback(body),
    answerForm(body, (answer) => api(path + "/response", { method: "POST", body: answer, auth: false }))));
}

// ---- routing --------------------------------------------------------------------------

function render() {
  leave();
  leave = () => {};
  const hash = location.hash || "#/inbox";
  const [route, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = route.split("/").filter(Boolean);
  document.getElementById("signout").hidden = !token() || parts[0] === "link";
  if (parts[0] === "link" && parts[1]) return linkPage(decodeURIComponent(parts[1]));
  if (!token()) return signIn();
  if (parts[0] === "runs" && parts[1]) return runPage(decodeURIComponent(parts[1]));
  if (parts[0] === "runs") return runsView(params);
  return inbox(params);
}

document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.hash = "#/inbox";
  render();
});
window.addEventListener("hashchange", render);
render();
