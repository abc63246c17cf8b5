// The console for operators in a real browser (Debian's Chromium, headless, driven by
// Playwright's client). Run by tests/tests/browser.rs, which starts `baton dev`'s server with
// three runs made (one with a subagent, one with a two-step plan, one waiting on a question)
// and passes what this script needs as JSON in BATON_BROWSER.
//
// It lists the runs and filters them, checks the chart draws, starts a run from the console
// and watches it complete, sends it a follow-up, forks it at its first turn with other words,
// reads the trees (a subagent; a plan's steps), and cancels the waiting run.
import assert from "node:assert/strict";
import { browser, cfg, step } from "./launch.mjs";

try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on("pageerror", (e) => { throw e; });
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });

  await page.goto(cfg.base + "/console#/runs");
  await page.getByLabel("Token").fill(cfg.token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Runs", exact: true }).waitFor();

  // The list: every run with its agent, status, age, cost and tokens.
  const table = page.getByRole("table", { name: "Runs" });
  const row = (run) => table.locator(`tr[data-run="${run}"]`);
  for (const run of [cfg.boss, cfg.release, cfg.asker]) await row(run).waitFor();
  assert.equal(await table.locator("tbody tr").count(), 3);
  assert.match(await row(cfg.boss).innerText(), /boss\s+completed\s+\d+ (s|min) ago\s+\$0\.0\d+\s+\d+/i);
  assert.match(await row(cfg.asker).innerText(), /asker\s+waiting/i);
  step("runs listed");

  // Filters: by status, then by agent (the page's query, so a link keeps them).
  await page.getByLabel("Status").selectOption("waiting");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/status=waiting/);
  await row(cfg.asker).waitFor();
  assert.equal(await table.locator("tbody tr").count(), 1);
  await page.getByLabel("Status").selectOption("");
  await page.locator("#f-agent").fill("boss");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/agent=boss/);
  await row(cfg.boss).waitFor();
  assert.equal(await table.locator("tbody tr").count(), 1);
  await page.locator("#f-agent").fill("nobody");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.getByText("No runs match.").waitFor();
  // Another owner's runs: the dev token's holder may read them (here, none).
  await page.locator("#f-agent").fill("");
  await page.getByLabel("Owner").fill("someone-else");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/owner=someone-else/);
  await page.getByText("No runs match.").waitFor();
  step("runs filtered");

  // The chart: runs and cost per day, a bar segment per agent, and the totals by agent.
  await page.goto(cfg.base + "/console#/runs");
  const chart = page.getByRole("region", { name: "Runs and cost per day" });
  await chart.getByRole("img", { name: /Runs per day/ }).waitFor();
  const today = new Date().toISOString().slice(0, 10);
  assert.match(await chart.getByRole("img", { name: /Runs per day/ }).getAttribute("aria-label"), new RegExp(today + " 3"));
  assert.ok(await chart.locator("svg.chart rect.bar").count() >= 6, "three agents' bars in each chart");
  const byAgent = chart.getByRole("table", { name: "By agent" });
  for (const a of ["asker", "boss", "release"]) assert.match(await byAgent.innerText(), new RegExp(a + "\\s+1\\s+\\$"));
  assert.doesNotMatch(await page.locator("main").innerText(), /\b(null|undefined|NaN)\b/);
  await page.screenshot({ path: cfg.shots + "/runs.png", fullPage: true });
  step("chart drawn");

  // A run started from the console: its page opens and it completes.
  await page.locator("#start-agent").fill("greeter");
  await page.getByLabel("Prompt").fill("say hello");
  await page.getByRole("button", { name: "Start" }).click();
  await page.waitForURL(/#\/runs\/run_/);
  const started = decodeURIComponent(page.url().split("#/runs/")[1]);
  const timeline = page.getByRole("list", { name: "Timeline" });
  await timeline.getByText("Hello from the console.").waitFor({ timeout: 15000 });
  await page.locator("section[aria-label=Run] .badge.completed").waitFor();
  step("run started from the console completed");

  // A follow-up from its page: the run takes another turn.
  await page.getByLabel("Follow-up message").fill("once more");
  await page.getByRole("button", { name: "Send follow-up" }).click();
  await page.getByRole("status").filter({ hasText: "Sent" }).waitFor();
  await timeline.getByText("Hello again.").waitFor({ timeout: 15000 });
  step("follow-up answered");

  // Fork here, at its first turn, with other words: the fork's page opens and completes.
  const first = timeline.locator('li[data-seq="0"]');
  await first.getByText("Fork here").click();
  await first.getByLabel("The turn's text in the fork").fill("say hi");
  await first.getByRole("button", { name: "Fork" }).click();
  await page.waitForURL((u) => !u.href.endsWith(started));
  const fork = decodeURIComponent(page.url().split("#/runs/")[1]);
  await timeline.getByText("say hi").waitFor();
  await timeline.getByText("Hello from the console.").waitFor({ timeout: 15000 });
  step("forked from the console");

  // Trees: the boss's subagent; the plan's two steps, each with its run.
  await page.goto(cfg.base + "/console#/runs/" + cfg.boss);
  const tree = page.getByRole("region", { name: "Run tree" });
  await tree.locator("li.subagent").filter({ hasText: "helper" }).locator(".badge.completed").waitFor();
  assert.match(await tree.innerText(), /boss\s+completed/i);
  await page.goto(cfg.base + "/console#/runs/" + cfg.release);
  for (const id of ["check", "ship"]) {
    const s = tree.locator(`li.step[data-step="${id}"]`);
    await s.locator(".badge.success").first().waitFor();
    assert.match(await s.innerText(), /helper\s+completed/i);
  }
  assert.match(await tree.locator("li.plan").innerText(), /2\/2 steps/);
  assert.doesNotMatch(await tree.innerText(), /\b(null|undefined|NaN)\b/);
  await page.screenshot({ path: cfg.shots + "/tree.png", fullPage: true });
  step("trees shown");

  // Cancel the waiting run from its page.
  await page.goto(cfg.base + "/console#/runs/" + cfg.asker);
  await page.getByRole("button", { name: "Cancel run" }).click();
  await page.getByRole("status").filter({ hasText: "Cancel sent" }).waitFor();
  await page.locator("section[aria-label=Run] .badge.cancelled").waitFor({ timeout: 15000 });
  step("run cancelled");

  assert.deepEqual(errors.filter((e) => !e.includes("status of 4")), []);
  assert.notEqual(fork, started);
  console.log("browser: all passed");
} finally {
  await browser.close();
}
