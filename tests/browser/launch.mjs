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
