// The console's live view of a run: its server's stream, else polling and, on AWS, the
// deployment's live channel. Loaded before console.js, whose helpers (`api`, `token`) it
// calls once the page runs.
"use strict";

// Follows a run: Server-Sent Events when the server streams, polling the timeline cursor
// when it does not (API Gateway). One path for the page: `put` each entry, `state` the run,
// `onLive` what a step shows before it commits (a streaming reply, a running tool).
async function follow(runId, signal, put, state, live, onLive) {
  const path = `/runs/${encodeURIComponent(runId)}`;
  // `follow=true`: the stream stays open while the run rests (waiting, or ended: an answer or
  // a follow-up moves it again). Streams still end (a server restarting); each reconnect
  // resumes from the id of the last event read, which is the cursor just after that event.
  let cursor = null;
  while (!signal.aborted) {
    let r;
    try {
      const headers = { "Authorization": "Bearer " + token(), "Accept": "text/event-stream" };
      if (cursor !== null) headers["Last-Event-ID"] = cursor;
      r = await fetch(path + "/stream?follow=true", { headers, signal });
    } catch (e) {
      if (signal.aborted) return;
      live.textContent = "Reconnecting…";
      await new Promise((ok) => setTimeout(ok, 2000));
      continue;
    }
    if (!r.ok || !(r.headers.get("content-type") || "").startsWith("text/event-stream")) break;
    live.textContent = "Live (streaming)";
    try {
      const reader = r.body.getReader();
      const text = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += text.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let event = "message", data = "", id = null;
          for (const line of frame.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (data) {
            const v = JSON.parse(data);
            if (event === "entry") put(v);
            else if (event === "run") state(v);
            else onLive(event, v);
          }
          // The event is in: its id is where a reconnect resumes (after it, not before).
          if (id) cursor = id;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    live.textContent = "Reconnecting…";
    await new Promise((ok) => setTimeout(ok, 1000));
  }
  if (signal.aborted) return;
  // Polling: entries after the cursor (the last seq before any that may still change); what
  // a step shows before it commits, and what it committed, from the deployment's live
  // channel if it has one. While the channel holds and carries every commit (its grant says
  // steps publish them, and a step has been heard from since it subscribed: one under way
  // before may not publish), the timeline is read only to catch up (at each subscription,
  // after an event too large to carry its entries or one past what is shown) and once
  // every 30 s; else every 1.5 s.
  live.textContent = "Live (polling)";
  let after = null;
  let seen = -1; // the last seq shown
  let open = false; // an entry after the cursor may still change (a pending result)
  const channel = { subscribed: false, pushes: false, wake: () => {} };
  const settle = (e) => {
    seen = Math.max(seen, e.seq);
    if (e.type === "tool" && e.result.status === "pending") open = true;
    if (!open && (after === null ? e.seq === 0 : e.seq === after + 1)) after = e.seq;
  };
  const committed = async (e) => {
    channel.pushes = true;
    if (e.truncated || e.from > seen + 1) return channel.wake();
    for (const x of e.entries) {
      put(x);
      settle(x);
    }
    const run = await api(path, { signal }).catch(() => null);
    if (run && run.status === 200) state(run.body);
  };
  watchChannel(runId, signal, onLive, live, channel, committed);
  while (!signal.aborted) {
    const q = path + "/timeline" + (after === null ? "" : "?after=" + after);
    const { status, body } = await api(q, { signal }).catch(() => ({ status: 0 }));
    if (status === 200) {
      open = false;
      for (const e of body.entries) {
        put(e);
        settle(e);
      }
      const run = await api(path, { signal }).catch(() => null);
      if (run && run.status === 200) state(run.body);
    }
    const wait = channel.subscribed && channel.pushes ? 30000 : 1500;
    await new Promise((ok) => {
      const t = setTimeout(ok, wait);
      channel.wake = () => { clearTimeout(t); ok(); };
    });
  }
}

// The run's live channel on AWS (AppSync Events). A connection that closes (AppSync ends
// each within a day; networks drop) is made again with a fresh grant, after 1 s, doubling
// to 30 s while none subscribes; committed entries come by polling meanwhile, and by the
// channel (`committed` events) while it holds.
async function watchChannel(runId, signal, onLive, live, channel, committed) {
  let wait = 1000;
  while (!signal.aborted) {
    const subscribed = await watchOnce(runId, signal, onLive, live, channel, committed);
    channel.subscribed = false;
    channel.wake(); // polling again, at once
    if (subscribed === null || signal.aborted) return;
    wait = subscribed ? 1000 : Math.min(wait * 2, 30000);
    live.textContent = "Live (polling)";
    await new Promise((ok) => setTimeout(ok, wait));
  }
}

// One connection: `POST /runs/{id}/watch` grants a subscription (a token for the run's
// channel, renewed while open), then the WebSocket protocol: subprotocols
// `aws-appsync-event-ws` and `header-<authorization>`, `connection_init` → `connection_ack`,
// `subscribe` → `subscribe_success`, then `data`. Null when the deployment has no channel,
// else, once closed, whether it had subscribed.
async function watchOnce(runId, signal, onLive, live, channel, committed) {
  const path = `/runs/${encodeURIComponent(runId)}/watch`;
  const grant = await api(path, { method: "POST", signal }).catch(() => ({ status: 0 }));
  if (grant.status === 0 || grant.status >= 500) return false;
  if (grant.status !== 200 || grant.body.transport !== "appsync-events") return null;
  const w = grant.body;
  const auth = { host: w.host, Authorization: w.token };
  const b64url = (s) => btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  let ws;
  try {
    ws = new WebSocket(w.realtimeUrl, ["aws-appsync-event-ws", "header-" + b64url(JSON.stringify(auth))]);
  } catch (_) { return false; }
  const renew = setInterval(() => api(path, { method: "POST", signal }).catch(() => null),
    Math.max(10, w.renewAfterSeconds) * 1000);
  const abort = () => ws.close();
  signal.addEventListener("abort", abort);
  const id = "run-" + Math.random().toString(36).slice(2);
  let subscribed = false;
  ws.onopen = () => ws.send(JSON.stringify({ type: "connection_init" }));
  ws.onmessage = (m) => {
    let v;
    try { v = JSON.parse(m.data); } catch (_) { return; }
    if (v.type === "connection_ack") {
      ws.send(JSON.stringify({ type: "subscribe", id, channel: w.channel, authorization: auth }));
    } else if (v.type === "subscribe_success") {
      subscribed = true;
      channel.subscribed = true;
      channel.pushes = false; // until a step is heard from on this subscription
      channel.wake(); // catch up from the cursor: what committed while it was away
      live.textContent = "Live (streaming)";
    } else if (v.type === "data" && v.id === id) {
      for (const text of Array.isArray(v.event) ? v.event : [v.event]) {
        let e;
        try { e = JSON.parse(text); } catch (_) { continue; /* not an event of ours */ }
        if (e.type === "committed") committed(e);
        else {
          if (w.committed && !channel.pushes) {
            // This step will publish its commit; one under way before it may not have.
            channel.pushes = true;
            channel.wake();
          }
          onLive(e.type, e);
        }
      }
    }
  };
  await new Promise((closed) => { ws.onclose = closed; });
  clearInterval(renew);
  signal.removeEventListener("abort", abort);
  return subscribed;
}
