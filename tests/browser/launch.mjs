// What each browser script starts from: its configuration (JSON in BATON_BROWSER, from the
// Rust test that runs it), Debian's Chromium launched headless by Playwright's client
// (`playwright-core`, from the node_modules the test installed), and a step logger.
import { createRequire } from "node:module";
import { mkdirSync } from "node:fs";

export const cfg = JSON.parse(process.env.BATON_BROWSER);
const require = createRequire(cfg.nodeModules + "/");
const { chromium } = require("playwright-core");

mkdirSync(cfg.shots, { recursive: true });
export const browser = await chromium.launch({
  executablePath: cfg.chromium,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
export const step = (what) => console.log("browser: " + what);

// What a page shows only for a moment (the run's status while it connects again, a reply's
// draft until its entry commits, a tool while it runs) is recorded in the page as it
// changes, so that a loaded machine's late look does not miss it. Call before the page
// loads; the returned function reads `{live, drafts, running}`, each in the order shown (a
// value is added when it differs from the one before).
export async function recordPassing(page) {
  await page.addInitScript(() => {
    const seen = { live: [], drafts: [], running: [] };
    window.seen = seen;
    const add = (list, v) => {
      if (v && JSON.stringify(list[list.length - 1]) !== JSON.stringify(v)) list.push(v);
    };
    new MutationObserver(() => {
      const status = [...document.querySelectorAll("p.live")].find((p) => !p.closest("ol"));
      add(seen.live, status && status.textContent);
      for (const p of document.querySelectorAll("li.assistant.streaming p")) {
        add(seen.drafts, p.textContent.trim());
      }
      for (const li of document.querySelectorAll("li.tool.running")) {
        const badge = li.querySelector(".badge.running");
        add(seen.running, { text: li.textContent, badge: badge && badge.textContent });
      }
    }).observe(document, { subtree: true, childList: true, characterData: true });
  });
  return () => page.evaluate(() => window.seen);
}
