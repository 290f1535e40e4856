// The console shell renders on the server and hydrates in the browser: the theme toggle
// only reacts once the wasm bundle has taken over the server's markup. `/` sends a
// visitor without a session to sign in; a page that does not exist keeps the session;
// queued (pending) and running work look different.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { artifacts, hydrated, launchBrowser, signedInPage, startHypd } from './support.mjs';
import { BYTES_MARGIN, COLD_REQUESTS, PAGES, WARM_REQUESTS, coldLoad, sessionCookie } from './budget.mjs';

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

test('/ without a session redirects to sign-in, which hydrates; the theme toggle works', async () => {
  // A plain redirect, before any script runs.
  const res = await fetch(server.url, { redirect: 'manual', headers: { accept: 'text/html' } });
  assert.equal(res.status, 302);
  assert.equal(res.headers.get('location'), '/login?next=/');

  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
  const response = await page.goto(server.url);
  assert.equal(response.status(), 200);
  assert.equal(new URL(page.url()).pathname + new URL(page.url()).search, '/login?next=/');
  // Server-rendered before any script runs.
  const html = await response.text();
  assert.match(html, /<a class="brand" href="\/">hypd<\/a>/);
  assert.match(html, /<h1>Sign in<\/h1>/);

  await hydrated(page);
  const toggle = page.locator('button.theme-toggle');
  assert.equal(await toggle.textContent(), 'Theme: system');
  await toggle.click();
  await page.waitForSelector('.console[data-theme="light"]');
  await toggle.click();
  await page.waitForSelector('.console[data-theme="dark"]');
  assert.equal(await toggle.textContent(), 'Theme: dark');
  await page.waitForSelector('.sandbox-banner');
  await page.screenshot({ path: path.join(artifacts, 'console-shell.png'), fullPage: true });

  // Signing in from there lands on the overview, with the console's facts.
  await page.fill('#token', server.adminToken());
  await Promise.all([page.waitForURL(new URL('/', server.url).href), page.click('button[type="submit"]')]);
  await hydrated(page);
  await page.waitForSelector('.overview .attention');
  assert.match(await page.locator('.facts.about').textContent(), /sandbox \(moto \+ sim\)/);
  assert.deepEqual(errors, []);
});

test('a page that does not exist keeps the session: who, Live, the sandbox banner', async () => {
  const { page, errors } = await signedInPage(browser, server, server.adminToken(), {
    allow: /status of 404/,
  });
  const response = await page.goto(new URL('/no-such-page', server.url).href);
  assert.equal(response.status(), 404);
  await hydrated(page);
  await page.waitForSelector('h1:text("Not found")');
  await page.waitForSelector('.user-name:text("admin")');
  await page.waitForSelector('.link-connected');
  await page.waitForSelector('.sandbox-banner');
  assert.equal(await page.locator('a.button:text("Sign in")').count(), 0);
  await page.screenshot({ path: path.join(artifacts, 'not-found.png'), fullPage: true });
  assert.deepEqual(errors, []);
});

test('pending and running badges look different, in both themes', async () => {
  const { page, errors } = await signedInPage(browser, server, server.adminToken());
  await page.goto(new URL('/operations', server.url).href);
  await hydrated(page);
  for (const scheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme: scheme });
    const looks = await page.evaluate(() => {
      const host = document.querySelector('.console');
      const look = (state) => {
        const badge = document.createElement('span');
        badge.className = `badge state state-${state}`;
        badge.textContent = state;
        host.appendChild(badge);
        const s = getComputedStyle(badge);
        const dot = getComputedStyle(badge, '::before');
        const seen = { background: s.backgroundColor, color: s.color, outline: s.boxShadow, dot: dot.content };
        badge.remove();
        return seen;
      };
      return { pending: look('pending'), running: look('running') };
    });
    assert.notEqual(looks.pending.background, looks.running.background, `${scheme}: ${JSON.stringify(looks)}`);
    assert.notEqual(looks.pending.color, looks.running.color, `${scheme}: ${JSON.stringify(looks)}`);
    // Running work carries a dot; queued work does not.
    assert.equal(looks.running.dot, '""', scheme);
    assert.equal(looks.pending.dot, 'none', scheme);
  }
  assert.deepEqual(errors, []);
});

// Brotli where the browser takes it (console-build writes both copies), gzip otherwise;
// revalidated before reuse, since the names carry no hash.
test('the bundle is served compressed', async () => {
  for (const file of ['pkg/hypd.js', 'pkg/hypd.wasm', 'pkg/hypd.css']) {
    for (const [accept, encoding] of [['gzip', 'gzip'], ['gzip, deflate, br', 'br']]) {
      const res = await fetch(new URL(file, server.url), { headers: { 'accept-encoding': accept } });
      assert.equal(res.status, 200, file);
      assert.equal(res.headers.get('content-encoding'), encoding, `${file} for ${accept}`);
      assert.equal(res.headers.get('cache-control'), 'no-cache', file);
      assert.ok((await res.arrayBuffer()).byteLength > 0, file);
    }
  }
});

// Through an SSM tunnel every request is a round trip, so a page's requests are budgeted
// (issue 34): each page cold, with an empty cache, and a move between pages inside the
// console. The chunks wasm-split cuts are fetched as one pack per page.
test('every page loads cold within the request budget, and a navigation within the warm one', async () => {
  const cookie = await sessionCookie(server);
  const over = [];
  for (const [route, bytesNow] of PAGES) {
    const cold = await coldLoad(browser, server.url, route, route === '/login' ? null : cookie);
    await cold.context.close();
    const allowed = Math.round(bytesNow * BYTES_MARGIN);
    if (cold.requests > COLD_REQUESTS || cold.bytes > allowed) {
      over.push(`${route}: ${cold.requests} requests, ${cold.bytes} bytes (${allowed} allowed): ${cold.urls.join(' ')}`);
    }
  }
  assert.deepEqual(over, [], `over ${COLD_REQUESTS} requests or a page's bytes`);

  // From the overview to each page of the top navigation and back, once each page's
  // code is known to the browser or not.
  const cold = await coldLoad(browser, server.url, '/', cookie);
  try {
    const { page, meter } = cold;
    for (const [link, ready] of [
      ['Clusters', '.page h1:text("Clusters")'],
      ['Endpoints', '.page h1:text("Endpoints")'],
      ['Operations', '.page h1:text("Operations")'],
      ['Tokens', '.page h1:text("API tokens")'],
      ['Clusters', '.page h1:text("Clusters")'],
    ]) {
      await page.click(`nav a:text-is("${link}")`);
      await page.waitForSelector(ready);
      await page.waitForTimeout(500);
      const warm = await meter.take();
      assert.ok(
        warm.requests <= WARM_REQUESTS,
        `to ${link}: ${warm.requests} requests: ${warm.urls.join(' ')}`,
      );
    }
  } finally {
    await cold.context.close();
  }
});
