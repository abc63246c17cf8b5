// The console in a real browser: Debian's Chromium, headless, driven by Playwright's client.
// Run by tests/tests/browser.rs, which starts `baton dev`'s server with three runs that each
// wait on one kind of question, and passes what this script needs as JSON in BATON_BROWSER.
//
// It signs in, screenshots the inbox (laptop and phone), answers each question through its
// form on the run's page and waits for that page's live timeline to show the run finished,
// then checks the one-time answer links: one answers without signing in, a second opening
// says it was used, a tampered one is refused.
import assert from "node:assert/strict";
import { browser, cfg, recordPassing, step } from "./launch.mjs";

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.on("pageerror", (e) => { throw e; });
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });

  // The API requests the page makes (paths), to check what the inbox asks for.
  const asked = [];
  page.on("request", (r) => {
    const path = new URL(r.url()).pathname;
    if (path.startsWith("/runs") || path.startsWith("/ctas")) asked.push(path);
  });

  const seen = await recordPassing(page);

  // Sign in with the dev token.
  await page.goto(cfg.base + "/console");
  await page.getByLabel("Token").fill(cfg.token);
  await page.getByRole("button", { name: "Sign in" }).click();
  step("signed in");

  // The inbox: one card per waiting question, with its run's prompt and agent.
  await page.getByRole("heading", { name: "Waiting for you" }).waitFor();
  for (const q of ["Ship v2 to production?", "Which release name?", "Which region?"]) {
    await page.getByRole("article", { name: q }).waitFor();
  }
  const shipCard = page.getByRole("article", { name: "Ship v2 to production?" });
  assert.match(await shipCard.innerText(), /Prompt\s+release v2/i);
  assert.match(await shipCard.innerText(), /agent approver/);
  assert.match(await shipCard.innerText(), /(d|h|min) .*left/);
  // One request for the page of questions, one for those assigned to you (none here): each
  // question carries its run's prompt and agent, so there is no request per question.
  assert.deepStrictEqual(asked, ["/ctas", "/ctas"], "the inbox's requests");
  await page.screenshot({ path: cfg.shots + "/inbox.png", fullPage: true });
  step("inbox shown");

  // Each kind answered through its form on the run's page, the live timeline moving on.
  const answer = async (run, fill, final) => {
    await page.goto(cfg.base + "/console#/runs/" + run);
    await page.getByText("Live (streaming)").waitFor();
    await fill();
    await page.getByRole("status").filter({ hasText: "Accepted" }).waitFor();
    await page.getByRole("list", { name: "Timeline" }).getByText(final).waitFor({ timeout: 15000 });
    await page.locator(".badge.completed").first().waitFor();
  };
  await answer(cfg.runs.approval, async () => {
    await page.getByLabel("Reason (optional)").fill("Looks good");
    const mark = (await seen()).drafts.length;
    await page.getByRole("button", { name: "Approve" }).click();
    // The reply is written as the model streams it, before its entry commits: a draft that
    // grows, then gives way to the entry.
    await page.waitForFunction((mark) => window.seen.drafts.length >= mark + 2, mark,
      { timeout: 15000 });
    const [early, later] = (await seen()).drafts.slice(mark);
    const reply = cfg.approvalReply;
    assert.ok(reply.startsWith(early) && early.length < reply.length, early);
    assert.ok(reply.startsWith(later) && later.length > early.length, later);
    await page.screenshot({ path: cfg.shots + "/streaming.png", fullPage: true });
  }, "will hear from support this afternoon.");
  assert.equal(await page.locator("li.assistant.streaming").count(), 0);
  step("approval answered, its reply streamed");
  await answer(cfg.runs.text, async () => {
    const box = page.getByLabel("Your answer (required)");
    assert.equal(await box.getAttribute("placeholder"), "e.g. Aurora");
    await box.fill("Aurora");
    await page.getByRole("button", { name: "Send", exact: true }).click();
  }, "Named it Aurora.");
  step("text answered");
  await answer(cfg.runs.choice, async () => {
    const eu = page.getByRole("button", { name: /Europe/ });
    assert.match(await eu.innerText(), /Frankfurt/);
    await eu.click();
  }, "Deployed to the chosen region.");
  await page.screenshot({ path: cfg.shots + "/run.png", fullPage: true });
  assert.doesNotMatch(await page.locator("main").innerText(), /\b(null|undefined)\b/);
  step("choice answered");

  // A tool shown running (a spinner) before its entry commits, then how long it took.
  await page.goto(cfg.base + "/console#/runs/" + cfg.slow.run);
  await page.getByText("Live (streaming)").waitFor();
  const ran = (await seen()).running.length;
  await page.getByRole("button", { name: "Approve" }).click();
  await page.waitForFunction((ran) => window.seen.running.length > ran, ran, { timeout: 15000 });
  const running = (await seen()).running[ran];
  assert.match(running.text, /report/);
  assert.equal(running.badge, "running");
  await page.screenshot({ path: cfg.shots + "/tool-running.png", fullPage: true });
  await page.getByRole("list", { name: "Timeline" }).getByText("Report done.").waitFor({ timeout: 15000 });
  assert.equal(await page.locator("li.tool.running").count(), 0);
  const entry = page.locator("li.tool").filter({ has: page.locator(".kind code", { hasText: /^report$/ }) });
  const took = await entry.locator(".kind").first().textContent();
  const ms = Number((took.match(/(\d+) ms/) || [])[1]);
  assert.ok(ms >= 1500, took);
  step("a tool shown running, then how long it took");

  // A plan under way: the run's state says so, with its steps done of all.
  await page.goto(cfg.base + "/console#/runs/" + cfg.plan.run);
  await page.getByText("executing_plan · 0/2 steps").waitFor({ timeout: 15000 });
  await page.getByRole("table", { name: "Plan steps" }).waitFor();
  // The reviewer's verdict and notes, on the plan's call.
  const review = page.getByLabel("Plan review");
  await review.getByText("The plan reviewer approved the plan").waitFor();
  assert.ok((await review.textContent()).includes("Checks come first: good."), await review.textContent());
  await page.screenshot({ path: cfg.shots + "/plan.png", fullPage: true });
  // Its first step's question answered on that step's own run page, the plan goes on.
  await page.getByRole("table", { name: "Plan steps" }).getByRole("link").first().click();
  await page.getByRole("button", { name: "Approve" }).click();
  await page.getByRole("status").filter({ hasText: "Accepted" }).waitFor();
  await page.goto(cfg.base + "/console#/runs/" + cfg.plan.run);
  await page.getByRole("list", { name: "Timeline" }).getByText("The plan ran.").waitFor({ timeout: 15000 });
  step("a plan shown with its reviewer's verdict, under way, then done");

  // A run past its budget: its question says the figures; the answer raises by its own
  // amount beyond what was spent ($0.10 past the budget), and the run's page shows the
  // budget raised.
  await page.goto(cfg.base + "/console#/runs/" + cfg.budget.run);
  await page.getByText("Budget: spent $0.6000 of $0.5000 · approving adds $0.5000 beyond what it has spent")
    .waitFor({ timeout: 15000 });
  await page.getByLabel("Raise by, in US dollars (optional)").fill("2");
  await page.getByRole("button", { name: "Approve" }).click();
  await page.getByRole("status").filter({ hasText: "Accepted" }).waitFor();
  await page.getByRole("list", { name: "Timeline" }).getByText("Within budget.")
    .waitFor({ timeout: 15000 });
  await page.reload();
  await page.getByText("Budget: spent $1.2000 of $2.6000 (raised 1×, by $2.1000)")
    .waitFor({ timeout: 15000 });
  step("a budget question answered with a raise");

  // Where the server does not stream (API Gateway), the same page polls the timeline cursor.
  const poll = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  await poll.goto(cfg.polling.base + "/console#/runs/" + cfg.polling.run);
  await poll.getByLabel("Token").fill(cfg.token);
  await poll.getByRole("button", { name: "Sign in" }).click();
  await poll.getByText("Live (polling)").waitFor();
  await poll.getByRole("button", { name: "Approve" }).click();
  await poll.getByRole("status").filter({ hasText: "Accepted" }).waitFor();
  await poll.getByRole("list", { name: "Timeline" }).getByText("Rolled back.").waitFor({ timeout: 15000 });
  step("polling page moved on");

  // A tool's widgets drawn by their kind, and its file downloaded.
  await page.goto(cfg.base + "/console#/runs/" + cfg.report.run);
  const table = page.getByRole("list", { name: "Timeline" }).getByRole("table");
  await table.getByRole("cell", { name: "eu", exact: true }).waitFor();
  assert.deepEqual(await table.getByRole("columnheader").allInnerTexts(), ["region", "sales"]);
  const card = page.locator("dl.kv");
  assert.match(await card.innerText(), /total\s+42/);
  const [file] = await Promise.all([
    page.waitForEvent("download"),
    page.getByRole("link", { name: "Download sales.csv" }).click(),
  ]);
  assert.equal(file.suggestedFilename(), "sales.csv");
  const { readFileSync } = await import("node:fs");
  assert.equal(readFileSync(await file.path(), "utf8"), cfg.report.csv);
  await page.screenshot({ path: cfg.shots + "/report.png", fullPage: true });
  step("widgets drawn, file downloaded");
  // Its prompt was sent with `visible: false`: in the timeline, shown only on asking.
  const prompt = page.locator("li.user").filter({ hasText: "sales?" });
  assert.equal(await prompt.count(), 1);
  assert.equal(await prompt.isVisible(), false, "a hidden turn is left out of the conversation");
  await page.getByLabel("Show hidden turns").check();
  await prompt.waitFor({ state: "visible" });
  assert.match(await prompt.innerText(), /hidden/i);
  step("hidden turn left out until asked for");

  // One-time links: no sign-in (a fresh context has no token), one answer, then "used".
  if (cfg.link) {
    const guest = await browser.newContext({ viewport: { width: 390, height: 844 } });
    const g = await guest.newPage();
    await g.goto(cfg.link);
    await g.getByRole("heading", { name: "Deploy the hotfix now?" }).waitFor();
    await g.screenshot({ path: cfg.shots + "/link.png", fullPage: true });
    await g.getByRole("button", { name: "Approve" }).click();
    await g.getByRole("status").filter({ hasText: "Accepted" }).waitFor();
    step("link answered");
    const again = await guest.newPage();
    await again.goto(cfg.link);
    await again.getByRole("alert").filter({ hasText: "This link was already used" }).waitFor();
    step("link used");
    for (const bad of [cfg.tampered, cfg.expired]) {
      const p = await guest.newPage();
      await p.goto(bad.url);
      await p.getByRole("alert").filter({ hasText: bad.says }).waitFor();
    }
    step("bad links refused");
  }
  // The inbox is empty now; on a phone too.
  await page.goto(cfg.base + "/console#/inbox");
  await page.getByText("Nothing waits for you.").waitFor();
  const phone = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await phone.goto(cfg.base + "/console#/runs/" + cfg.runs.choice);
  await phone.getByLabel("Token").fill(cfg.token);
  await phone.getByRole("button", { name: "Sign in" }).click();
  await phone.locator(".badge.completed").first().waitFor();
  await phone.screenshot({ path: cfg.shots + "/run-phone.png", fullPage: true });
  step("phone view");

  assert.deepEqual(errors.filter((e) => !e.includes("status of 4")), []);
  console.log("browser: all passed");
} finally {
  await browser.close();
}
