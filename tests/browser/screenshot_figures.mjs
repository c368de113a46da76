// Render a run's standalone figure HTML files to PNG (for the README):
//   node tests/browser/screenshot_figures.mjs outputs/default/figures docs/img
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

const [src, dst] = process.argv.slice(2);
fs.mkdirSync(dst, { recursive: true });
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1100, height: 520 } });
for (const f of fs.readdirSync(src).filter((f) => f.endsWith(".html")).sort()) {
  await page.goto("file://" + path.resolve(src, f));
  await page.waitForSelector(".js-plotly-plot .main-svg", { timeout: 30000 });
  await page.waitForTimeout(500);
  const out = path.join(dst, f.replace(/\.html$/, ".png"));
  await page.screenshot({ path: out, fullPage: true });
  console.log("wrote", out);
}
await browser.close();
