// The console shell renders on the server and hydrates in the browser: the theme toggle
// only reacts once the wasm bundle has taken over the server's markup.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { artifacts, launchBrowser, startHypd } from './support.mjs';

let server;
let browser;

before(async () => {
  server = await startHypd({ sandbox: true });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

test('server-rendered page hydrates and the theme toggle works', async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));

  const response = await page.goto(server.url);
  assert.equal(response.status(), 200);
  // Server-rendered before any script runs.
  const html = await response.text();
  assert.match(html, /<a class="brand" href="\/">hypd<\/a>/);

  await page.waitForSelector('html[data-hydrated="true"]', { timeout: 30_000 });
  const toggle = page.locator('button.theme-toggle');
  assert.equal(await toggle.textContent(), 'Theme: system');
  await toggle.click();
  await page.waitForSelector('.console[data-theme="light"]');
  await toggle.click();
  await page.waitForSelector('.console[data-theme="dark"]');
  assert.equal(await toggle.textContent(), 'Theme: dark');

  // The sandbox is announced, and the overview got its facts from a server function.
  await page.waitForSelector('.sandbox-banner');
  assert.match(await page.locator('.facts').textContent(), /sandbox \(moto \+ sim\)/);

  await page.screenshot({ path: path.join(artifacts, 'console-shell.png'), fullPage: true });
  assert.deepEqual(errors, []);
});

test('the bundle is served compressed', async () => {
  for (const file of ['pkg/hypd.js', 'pkg/hypd.wasm', 'pkg/hypd.css']) {
    const res = await fetch(new URL(file, server.url), { headers: { 'accept-encoding': 'gzip' } });
    assert.equal(res.status, 200, file);
    assert.equal(res.headers.get('content-encoding'), 'gzip', file);
  }
});
