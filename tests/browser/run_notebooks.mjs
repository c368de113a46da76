// Runs the eagle3nb notebooks in JupyterLab in headless Chromium and checks what a user would see.
//
//   node tests/browser/run_notebooks.mjs <base_url> <token> <screenshot_dir> [notebook.ipynb[+plotly] ...]
//
// For each notebook (01, 02a, 02b, 03, 04, in order): open it, wait for an idle kernel, Run > Run All
// Cells, wait until the kernel is idle and no cell shows [*], then check: every code cell executed,
// no error output (stderr output such as warnings is allowed), and for 02a/02b/03/04 a rendered plotly
// figure (non-zero size, SVG inside). A full-page screenshot is saved as <screenshot_dir>/<name>.png.
// The notebook is never saved: autosave is off (tests/test_browser.py sets it in the server's user
// settings; this script turns it off through the settings API otherwise), nothing here saves, and the
// tab is dropped by closing the page after its kernel session is shut down (tests/test_browser.py
// also makes the server refuse every save). Exit code 0 only if every check passed.
//
// Chromium: Debian's /usr/bin/chromium ($EAGLE3NB_CHROMIUM overrides), driven by playwright-core.

import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const NOTEBOOKS = [
  { name: '01_generate', plotly: false },
  { name: '02a_extract_vllm', plotly: true },
  { name: '02b_extract_sglang', plotly: true },
  { name: '03_train', plotly: true },
  { name: '04_eval_acceptance', plotly: true },
].map((nb) => ({ ...nb, nbPath: `notebooks/${nb.name}.ipynb` }));
const LOAD_TIMEOUT_MS = 90_000; // page load + kernel start
const RUN_TIMEOUT_MS = 420_000; // Run All Cells until idle, per notebook (04 serves with vLLM twice: slow on a loaded 2-core machine)
const PLOT_TIMEOUT_MS = 30_000; // plotly rendering after the run
const VIEWPORT = { width: 1400, height: 1800 };
const MAX_SHOT_HEIGHT = 12_000;

const [base0, token, shotDir, ...only] = process.argv.slice(2);
// Optional further arguments: other notebooks to run instead (paths under the server root; a
// "+plotly" suffix requires a figure), e.g. to check that this script fails on a broken notebook.
const todo = only.length
  ? only.map((a) => { const nbPath = a.replace(/\+plotly$/, ''); return { name: path.basename(nbPath, '.ipynb'), nbPath, plotly: a.endsWith('+plotly') }; })
  : NOTEBOOKS;
if (!base0 || !token || !shotDir) {
  console.error('usage: node run_notebooks.mjs <base_url> <token> <screenshot_dir>');
  process.exit(2);
}
const base = base0.replace(/\/+$/, '');
const executablePath = process.env.EAGLE3NB_CHROMIUM || '/usr/bin/chromium';
mkdirSync(shotDir, { recursive: true });

const t0 = Date.now();
const secs = (ms) => (ms / 1000).toFixed(1) + 's';
const log = (...a) => console.log(`[${secs(Date.now() - t0).padStart(6)}]`, ...a);

async function api(method, route, body) {
  const r = await fetch(`${base}${route}`, {
    method,
    headers: { Authorization: `token ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`${method} ${route}: HTTP ${r.status} ${await r.text()}`);
  return r.status === 204 ? null : r.json();
}

// Never let JupyterLab write the stored notebooks back.
async function ensureNoAutosave() {
  const id = '@jupyterlab/docmanager-extension:plugin';
  const s = await api('GET', `/lab/api/settings/${id}`);
  if (s.settings?.autosave !== false) {
    log('autosave was on: turning it off through the settings API');
    const raw = JSON.stringify({ ...(s.settings || {}), autosave: false }); // 'settings': the user's own
    await api('PUT', `/lab/api/settings/${id}`, { raw });
  }
}

async function shutdownSessions(nbPath) {
  const sessions = await api('GET', '/api/sessions');
  for (const s of sessions) {
    if (!nbPath || s.path === nbPath || s.notebook?.path === nbPath) await api('DELETE', `/api/sessions/${s.id}`);
  }
}

// Kernel state from the server (the truth), and the notebook's own view of it (the toolbar indicator).
async function kernelState(nbPath) {
  const sessions = await api('GET', '/api/sessions');
  const s = sessions.find((x) => x.path === nbPath || x.notebook?.path === nbPath);
  return s ? s.kernel.execution_state : null;
}

function cellStateFn() {
  // Runs in the page.
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  if (!nb) return { ready: false };
  const cells = [...nb.querySelectorAll('.jp-CodeCell')];
  const prompts = cells.map((c) => (c.querySelector('.jp-InputArea-prompt')?.textContent || '').trim());
  const ind = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  return {
    ready: true,
    nCells: cells.length,
    prompts,
    running: prompts.filter((p) => p.includes('*')).length,
    indicator: ind ? ind.getAttribute('data-status') : null,
  };
}

async function runAllCells(page) {
  // Run menu > Run All Cells. Lumino menu items carry their command id: in JupyterLab 4 the Run menu
  // entry is 'runmenu:run-all' (it runs 'notebook:run-all-cells' on the current notebook).
  try {
    await page.locator('#jp-menu-panel .lm-MenuBar-item', { hasText: /^Run$/ }).click({ timeout: 10_000 });
    await page.locator('.lm-Menu-item[data-command="runmenu:run-all"]:not(.lm-mod-disabled)').click({ timeout: 10_000 });
    return 'Run menu';
  } catch (e) {
    log('  Run menu failed (' + e.message.split('\n')[0] + '); trying the command palette');
    await page.keyboard.press('Escape');
    await page.keyboard.press('Control+Shift+C');
    await page.locator('.lm-CommandPalette-input').fill('Run All Cells', { timeout: 10_000 });
    await page.locator('.lm-CommandPalette-item[data-command="notebook:run-all-cells"]').first().click({ timeout: 10_000 });
    return 'command palette';
  }
}

// JupyterLab scrolls the notebook inside a fixed-size panel, so a plain full-page screenshot shows
// only the viewport: grow the viewport by the notebook's hidden scroll height first (capped).
async function screenshot(page, file) {
  const extra = await page.evaluate(() => {
    const sc = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
    const cells = sc ? sc.querySelectorAll('.jp-Cell') : [];
    if (!cells.length) return 0;
    // Height of the cells themselves (scrollHeight adds JupyterLab's scroll-past-end padding).
    const content = cells[cells.length - 1].getBoundingClientRect().bottom - sc.getBoundingClientRect().top + sc.scrollTop;
    return Math.max(0, Math.ceil(content - sc.clientHeight) + 40);
  });
  if (extra > 0) {
    await page.setViewportSize({ width: VIEWPORT.width, height: Math.min(VIEWPORT.height + extra, MAX_SHOT_HEIGHT) });
    await page.evaluate(() => { const sc = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer'); if (sc) sc.scrollTop = 0; });
    await page.waitForTimeout(1000); // relayout (plotly figures resize)
  }
  await page.screenshot({ path: file, fullPage: true });
}

const clip = (text) => (text.length > 3500 ? `${text.slice(0, 1000)}\n[...]\n${text.slice(-2500)}` : text);

async function waitUntil(fn, timeoutMs, what, intervalMs = 250) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last && last.ok) return last;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out after ${secs(timeoutMs)} waiting for ${what}; last state: ${JSON.stringify(last)}`);
}

async function runNotebook(browser, { name, nbPath, plotly }) {
  const failures = [];
  const timings = {};
  const context = await browser.newContext({ viewport: VIEWPORT });
  const page = await context.newPage();
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push('pageerror: ' + e.message));
  let t = Date.now();
  try {
    // "reset" empties the restored workspace, so only this notebook opens (and starts a kernel).
    await page.goto(`${base}/lab/tree/${nbPath}?token=${token}&reset`, { waitUntil: 'domcontentloaded', timeout: LOAD_TIMEOUT_MS });
    await page.locator('.jp-NotebookPanel .jp-Notebook .jp-Cell').first().waitFor({ timeout: LOAD_TIMEOUT_MS });
    await waitUntil(async () => {
      const [dom, k] = [await page.evaluate(cellStateFn), await kernelState(nbPath)];
      return { ok: dom.ready && dom.indicator === 'idle' && k === 'idle', dom: { ...dom, prompts: undefined }, kernel: k };
    }, LOAD_TIMEOUT_MS, 'an idle kernel');
    timings.open = Date.now() - t;
    log(`${name}: open + kernel idle in ${secs(timings.open)}`);

    const promptsBefore = (await page.evaluate(cellStateFn)).prompts;
    t = Date.now();
    const how = await runAllCells(page);
    // Wait until the kernel is idle, no cell shows [*] (stable over two polls), and the run has visibly
    // happened: a cell showed [*] or a prompt changed (Run All stops at the first error).
    let stable = 0;
    let sawRunning = false;
    const done = await waitUntil(async () => {
      const dom = await page.evaluate(cellStateFn);
      const k = await kernelState(nbPath);
      sawRunning ||= dom.running > 0;
      const changed = dom.prompts.some((p, i) => p !== promptsBefore[i]);
      const quiet = dom.running === 0 && dom.indicator === 'idle' && k === 'idle' && (sawRunning || changed);
      stable = quiet ? stable + 1 : 0;
      return { ok: stable >= 2, prompts: dom.prompts, indicator: dom.indicator, kernel: k };
    }, RUN_TIMEOUT_MS, 'Run All Cells to finish');
    timings.run = Date.now() - t;
    log(`${name}: run all cells (${how}) finished in ${secs(timings.run)}; prompts ${done.prompts.join(' ')}`);

    // Checks. JupyterLab 4 renders an error output (a traceback) with data-mime-type
    // application/vnd.jupyter.stderr, like stderr: no DOM attribute tells them apart, so an error is
    // recognised by its text (IPython's "Traceback (most recent call last)", or a SyntaxError's
    // "Cell In[n], line m" header). Run All stops at the first error, so unexecuted cells fail too.
    const outputs = await page.evaluate(() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')].map((e) => ({
      mime: e.getAttribute('data-mime-type') || (e.querySelector('.jupyter-widgets') ? 'widget' : e.classList.contains('jp-RenderedPlotly') ? 'plotly' : 'other'),
      text: e.textContent || '',
    })));
    const isError = (o) => o.mime === 'application/vnd.jupyter.error' || /Traceback \(most recent call last\)|^\s*Cell In\[\d+\], line \d+/m.test(o.text);
    const errors = outputs.filter(isError);
    if (errors.length) failures.push(`error output in ${errors.length} cell output(s):\n` + errors.map((o) => clip(o.text)).join('\n---\n'));
    const widgetErrors = outputs.filter((o) => /Error displaying widget|Error rendering output item|Javascript Error/.test(o.text));
    if (widgetErrors.length) failures.push('output failed to render in the browser:\n' + widgetErrors.map((o) => o.text.slice(0, 500)).join('\n---\n'));
    const notRun = done.prompts.filter((p) => !/^\[\d+\]/.test(p));
    if (notRun.length) failures.push(`${notRun.length} code cell(s) not executed: ${JSON.stringify(done.prompts)}`);
    const kinds = {};
    for (const o of outputs) kinds[o.mime] = (kinds[o.mime] || 0) + 1;
    log(`${name}: outputs by kind ${JSON.stringify(kinds)}`);
    for (const o of outputs) {
      if (o.mime === 'application/vnd.jupyter.stderr' && !isError(o)) log(`${name}: stderr (allowed): ${o.text.trim().slice(0, 300).replace(/\n/g, ' | ')}`);
    }

    // Plotly: a rendered figure (jupyterlab-plotly's renderer node, or a plotly div inside an HTML or
    // widget output) with non-zero size and SVG content.
    if (plotly) {
      t = Date.now();
      try {
        const plots = await waitUntil(async () => {
          const figs = await page.evaluate(() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-child :is(.js-plotly-plot, .plotly-graph-div)')].map((d) => {
            const r = d.getBoundingClientRect();
            return { w: Math.round(r.width), h: Math.round(r.height), svgs: d.querySelectorAll('svg.main-svg').length, traces: d.querySelectorAll('svg .trace').length };
          }));
          return { ok: figs.some((f) => f.w > 0 && f.h > 0 && f.svgs > 0), figs };
        }, PLOT_TIMEOUT_MS, 'a rendered plotly figure', 500);
        timings.plot = Date.now() - t;
        log(`${name}: plotly figure(s) rendered: ${JSON.stringify(plots.figs)}`);
      } catch (e) {
        failures.push(`no rendered plotly figure (${e.message}); outputs by kind ${JSON.stringify(kinds)}` +
          (kinds.other ? ' (an output of unknown kind: if it is JSON text, the jupyterlab-plotly extension is not loaded)' : ''));
      }
    }

    t = Date.now();
    await screenshot(page, path.join(shotDir, `${name}.png`));
    timings.screenshot = Date.now() - t;
    if (consoleErrors.length) log(`${name}: browser console errors (not failing): ${consoleErrors.slice(0, 5).join(' | ').slice(0, 800)}`);
  } catch (e) {
    failures.push(e.message);
    try { await screenshot(page, path.join(shotDir, `${name}.png`)); } catch {}
  } finally {
    // Close without saving: drop the kernel session, then the page (no beforeunload, no save).
    try { await shutdownSessions(nbPath); } catch (e) { log(`${name}: session shutdown failed: ${e.message}`); }
    await context.close();
  }
  return { name, failures, timings };
}

async function main() {
  await api('GET', '/api/status');
  await ensureNoAutosave();
  const tl = Date.now();
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    // Playwright gives every launch a fresh temporary --user-data-dir.
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  log(`chromium ${browser.version()} launched in ${secs(Date.now() - tl)} (${executablePath})`);
  const results = [];
  try {
    for (const nb of todo) {
      const tn = Date.now();
      const r = await runNotebook(browser, nb);
      r.timings.total = Date.now() - tn;
      results.push(r);
      log(`${nb.name}: ${r.failures.length ? 'FAILED' : 'ok'} in ${secs(r.timings.total)} -> ${path.join(shotDir, nb.name + '.png')}`);
      for (const f of r.failures) log(`${nb.name}: FAIL: ${f}`);
    }
  } finally {
    await browser.close();
  }
  console.log('\nsummary (seconds): notebook, open, run, plot, screenshot, total');
  for (const r of results) {
    const s = (k) => (r.timings[k] === undefined ? '-' : (r.timings[k] / 1000).toFixed(1));
    console.log(`  ${r.name.padEnd(20)} ${s('open').padStart(6)} ${s('run').padStart(6)} ${s('plot').padStart(6)} ${s('screenshot').padStart(6)} ${s('total').padStart(6)}  ${r.failures.length ? 'FAILED' : 'ok'}`);
  }
  console.log(`  all: ${secs(Date.now() - t0)}`);
  const failed = results.filter((r) => r.failures.length);
  if (failed.length) {
    console.log(`\nFAILED: ${failed.map((r) => r.name).join(', ')}`);
    process.exit(1);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
