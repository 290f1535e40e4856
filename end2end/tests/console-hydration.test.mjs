// Opening a running operation by its address on a slow machine: Chromium's CPU is
// throttled 8 times (CDP Emulation.setCPUThrottlingRate) and the operation page's own
// chunk is held back until the operation has moved on, so the live channel has news
// before the page is hydrated. The page must hydrate from the server's snapshot, then
// follow the live channel to the end: no hydration error, a header and stages that agree.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  artifacts,
  clearSimFault,
  hydrated,
  launchBrowser,
  pythonHelper,
  rest,
  signedInPage,
  startHypd,
  waitForOperation,
} from './support.mjs';

let server;
let browser;
let admin;

before(async () => {
  server = await startHypd({ sandbox: true });
  browser = await launchBrowser();
  admin = server.adminToken();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

// Resolves with true once `check()` holds, or false after `ms`.
async function until(check, ms) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (check()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return check();
}

test('a running operation opened by its address hydrates from the server, then follows live (CPU x8)', async () => {
  // Held in CREATING by the sim: the import waits at its eks stage until the fault goes.
  const eks = pythonHelper('eks_world.py', [server.world.motoUrl, server.world.simUrl, 'e2e-hydrate', 'creating']);
  const [status, started] = await rest(server, admin, 'POST', '/api/v1/clusters/import', {
    name: eks.name,
    region: 'us-east-1',
  });
  assert.equal(status, 200, JSON.stringify(started));
  const id = started.operation_id;
  await waitForOperation(server, admin, id, (op) => op.stages.some((s) => s.name === 'eks' && s.state === 'waiting'));

  const { page, errors } = await signedInPage(browser, server, admin);
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Emulation.setCPUThrottlingRate', { rate: 8 });
  // What the live channel delivers, if the page opens it while the chunk is held.
  const sockets = [];
  const frames = [];
  page.on('websocket', (ws) => {
    sockets.push(ws);
    ws.on('framereceived', (f) => frames.push(String(f.payload)));
  });
  let held = false;
  await page.route(/\/pkg\/pack_operation_route_view_\w+\.wasm$/, async (route) => {
    held = true;
    // A channel opened before hydration says hello within moments; give it the chance.
    const early = await until(() => frames.some((f) => f.includes('"hello"')), 8_000);
    await clearSimFault(server, eks.fault);
    await waitForOperation(server, admin, id, (op) => op.state === 'succeeded', { seconds: 60 });
    if (early) await until(() => frames.some((f) => f.includes('"state":"succeeded"')), 15_000);
    await route.continue();
  });

  const response = await page.goto(new URL(`/operations/${id}`, server.url).href);
  assert.equal(response.status(), 200);
  // The server rendered the operation as it was: waiting at the eks stage.
  assert.match(await response.text(), /data-stage="eks" data-state="waiting"/);
  await hydrated(page).catch((e) => {
    throw new Error(`${e.message}\npage errors: ${errors.join('\n')}`);
  });
  assert.ok(held, 'the operation page loaded without its chunk');
  await page.waitForSelector('.link-connected');
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 60_000 });
  const stages = await page.locator('.stage').evaluateAll((els) => els.map((e) => e.getAttribute('data-state')));
  assert.ok(stages.length >= 3 && stages.every((s) => s === 'succeeded'), `stages: ${stages}`);
  assert.equal((await page.textContent('.progress .page-head .badge')).trim(), 'succeeded');
  // Still alive: the page answers a click after all that.
  await page.click('button.theme-toggle');
  await page.waitForSelector('.console[data-theme="light"]');
  await page.screenshot({ path: path.join(artifacts, 'operation-hydrated-throttled.png'), fullPage: true });
  assert.deepEqual(errors, []);
});
