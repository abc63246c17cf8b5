// The console on the AWS path, in a real browser: the API served as the `api` function serves
// it behind API Gateway (no stream: the page polls the timeline), with the live channel's
// stand-in of AppSync Events. Run by tests/tests/live_aws.rs, with what it needs as JSON in
// BATON_BROWSER: the run page asks for a watch (`POST /runs/{id}/watch`), subscribes over
// AppSync Events' WebSocket protocol, and writes the reply as it streams, before its entry
// commits, from the channel, after the channel closed its first connection.
import assert from "node:assert/strict";
import { browser, cfg, recordPassing, step } from "./launch.mjs";

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.on("pageerror", (e) => { throw e; });
  const sockets = [];
  const frames = [];
  page.on("websocket", (ws) => {
    sockets.push(ws.url());
    ws.on("framesent", (f) => frames.push("> " + f.payload));
    ws.on("framereceived", (f) => frames.push("< " + f.payload));
    ws.on("socketerror", (e) => frames.push("! " + e));
  });
  page.on("console", (m) => frames.push("console: " + m.text()));
  const seen = await recordPassing(page);
  await page.goto(cfg.base + "/console#/runs/" + cfg.run);
  await page.getByLabel("Token").fill(cfg.token);
  await page.getByRole("button", { name: "Sign in" }).click();
  // Subscribed to the run's channel: the page says it streams though the API does not.
  await page.getByText("Live (streaming)").waitFor({ timeout: 15000 })
    .catch((e) => { throw new Error(e.message + "\n" + sockets.join(",") + "\n" + frames.join("\n")); });
  assert.ok(sockets.some((u) => u.endsWith("/event/realtime")), sockets.join(","));
  step("subscribed to the run's channel");
  // AppSync closes a connection at its time limit (or a network drops it): the page says it
  // polls, then connects and subscribes again with a fresh grant.
  const mark = (await seen()).live.length;
  const closed = await fetch(cfg.standin + "/_standin/close-connections", { method: "POST" });
  assert.equal(closed.status, 204);
  await page.waitForFunction((mark) => {
    const after = window.seen.live.slice(mark);
    const polling = after.indexOf("Live (polling)");
    return polling >= 0 && after.slice(polling).includes("Live (streaming)");
  }, mark, { timeout: 20000 })
    .catch(async (e) => {
      throw new Error(e.message + "\n" + JSON.stringify(await seen()) + "\n" + frames.join("\n"));
    });
  assert.equal(sockets.length, 2, sockets.join(","));
  step("connected and subscribed again after the channel closed the connection");
  await page.getByRole("button", { name: "Approve" }).click();
  await page.getByRole("status").filter({ hasText: "Accepted" }).waitFor();
  await page.waitForFunction(() => window.seen.drafts.length > 0, null, { timeout: 20000 });
  const early = (await seen()).drafts[0];
  assert.ok(cfg.reply.startsWith(early) || "Checking the logs first.".startsWith(early), early);
  await page.screenshot({ path: cfg.shots + "/aws-streaming.png", fullPage: true });
  step("a reply written as it streams, from the channel");
  // The committed entry (polled), not the draft that already holds the whole text.
  await page.locator("li.assistant:not(.streaming)").filter({ hasText: cfg.reply })
    .waitFor({ timeout: 20000 });
  assert.equal(await page.locator("li.assistant.streaming").count(), 0);
  assert.equal(await page.locator("li.tool.running").count(), 0);
  step("the committed entries replaced the drafts");
  console.log("browser: all passed");
} finally {
  await browser.close();
}
