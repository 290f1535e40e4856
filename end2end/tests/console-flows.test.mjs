// The console's main flows in headless Chromium against a sandbox hypd: signing in and
// out, importing an EKS cluster through the form (a bad field is refused beside it),
// following the operation live to "succeeded", the cluster's page, and a viewer who is
// offered no import and is refused by the server when trying anyway.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { artifacts, launchBrowser, pythonHelper, rest, startHypd } from './support.mjs';

let server;
let browser;
let admin;
let viewer;

before(async () => {
  server = await startHypd({ sandbox: true });
  browser = await launchBrowser();
  admin = server.adminToken();
  const [status, created] = await rest(server, admin, 'POST', '/api/v1/tokens', {
    name: 'e2e-viewer',
    role: 'viewer',
  });
  assert.equal(status, 200, JSON.stringify(created));
  viewer = created.token;
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

async function newPage({ allow } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  // Refusals the tests provoke on purpose are logged by Chromium as failed loads.
  const provoked = /Failed to load resource: the server responded with a status of (401|403)/;
  const expected = (text) => provoked.test(text) || (allow && allow.test(text));
  page.on('console', (m) => m.type() === 'error' && !expected(m.text()) && errors.push(m.text()));
  return { page, errors };
}

async function hydrated(page) {
  await page.waitForSelector('html[data-hydrated="true"]', { timeout: 30_000 });
}

async function signIn(page, token, next = '/clusters') {
  await page.goto(new URL(`/login?next=${next}`, server.url).href);
  await hydrated(page);
  await page.fill('#token', token);
  await Promise.all([page.waitForURL(new URL(next, server.url).href), page.click('button[type="submit"]')]);
  await hydrated(page);
}

// Laptop widths: nothing may push the page sideways (wide tables scroll in their frame).
async function fitsWidth(page, width) {
  const size = page.viewportSize();
  await page.setViewportSize({ width, height: size.height });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  await page.setViewportSize(size);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a ${width}px window`);
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
}

test('sign in with a token, see who and what role, sign out', async () => {
  const { page, errors } = await newPage();
  // Not signed in: the page says so instead of failing.
  const res = await page.goto(new URL('/clusters', server.url).href);
  assert.equal(res.status(), 200);
  await page.waitForSelector('[data-error="unauthorized"]');

  await page.goto(new URL('/login', server.url).href);
  await hydrated(page);
  // A refused token is reported beside the token field, by the server. Keyboard only.
  await page.focus('#token');
  await page.keyboard.type('hypd_not-a-real-token');
  await page.keyboard.press('Enter');
  await page.waitForSelector('.field[data-field="token"].invalid .field-error p');
  assert.equal(await page.getAttribute('#token', 'aria-invalid'), 'true');
  await shot(page, 'sign-in');

  await signIn(page, admin);
  assert.equal(await page.textContent('.user-name'), 'admin');
  assert.equal(await page.textContent('.user .role'), 'admin');
  await page.waitForSelector('.link-connected');

  await page.click('button.sign-out');
  await page.waitForURL(/\/login$/);
  await page.goto(new URL('/clusters', server.url).href);
  await page.waitForSelector('[data-error="unauthorized"]');
  assert.deepEqual(errors, []);
});

// Fills the import form with a valid request and lands on the operation's page.
async function importThroughForm(page, name) {
  await page.goto(new URL('/clusters/import', server.url).href);
  await hydrated(page);
  await page.fill('#name', name);
  await page.selectOption('#region', 'us-east-1');
  await page.click('button[type="submit"]');
  try {
    await page.waitForSelector('.review .plan');
    await page.click('button[type="submit"]');
    await page.waitForURL(/\/operations\/[^/]+$/);
  } catch (e) {
    await shot(page, `import-${name}-stuck`);
    throw e;
  }
  // Marks this document: if the page reloaded, the mark would be gone.
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
}

test('import a cluster through the form and watch it succeed live', async () => {
  // Held in CREATING by the sim until the test lets go: hypd waits, the panel shows it.
  const eks = pythonHelper('eks_world.py', [
    server.world.motoUrl,
    server.world.simUrl,
    'e2e-eks',
    'creating',
  ]);
  assert.equal(eks.status, 'CREATING');
  // The server's refusal of a field comes back from the server function as HTTP 422.
  const { page, errors } = await newPage({ allow: /status of 422/ });
  await signIn(page, admin);
  await page.waitForSelector('.page-head h1:text("Clusters")');
  await shot(page, 'clusters-empty');

  await page.click('a:text("Import cluster")');
  await page.waitForURL(/\/clusters\/import$/);
  await hydrated(page);
  // Regions come from inspection (list_regions).
  await page.waitForSelector('#region option[value="us-east-1"]', { state: 'attached' });

  // A bad name is refused beside the name field, by the request type's own rule.
  await page.fill('#name', 'not a name!');
  await page.click('button[type="submit"]');
  await page.waitForSelector('.field[data-field="name"].invalid .field-error p');
  assert.equal(await page.getAttribute('#name', 'aria-invalid'), 'true');
  assert.match(await page.textContent('#name-error'), /letters, digits/);
  assert.equal(await page.locator('.field[data-field="region"].invalid').count(), 0);
  await shot(page, 'import-form-error');

  // A well-formed name that EKS does not know: the server says so, beside the field.
  await page.fill('#name', 'no-such-eks');
  await page.selectOption('#region', 'us-east-1');
  await page.click('button[type="submit"]');
  await page.waitForSelector('#name-error p:text("there is no EKS cluster named no-such-eks")');
  assert.equal(await page.getAttribute('#name', 'aria-invalid'), 'true');
  assert.equal(await page.locator('.form-alert').count(), 0);
  await shot(page, 'import-form-server-error');

  await page.fill('#name', eks.name);
  await page.selectOption('#region', 'us-east-1');
  await page.click('button[type="submit"]');
  // Reviewed first: the plan, then the same button runs it.
  await page.waitForSelector('.review .plan li[data-kind="hypd:Cluster"][data-action="create"]');
  assert.equal(await page.textContent('button[type="submit"]'), 'Import cluster');
  await page.click('button[type="submit"]');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await page.waitForSelector('.link-connected');
  // The first stage waits for the EKS cluster to become ACTIVE, then everything moves
  // on by itself: the page is only ever told over the WebSocket.
  await page.waitForSelector('.stage[data-stage="eks"][data-state="waiting"]', { timeout: 30_000 });
  assert.match(await page.textContent('.stage[data-stage="eks"]'), /CREATING/);
  await page.waitForSelector('button:text("Cancel")');
  await shot(page, 'operation-waiting');
  const release = await fetch(new URL(`/_sim/faults/${eks.fault}`, server.world.simUrl), {
    method: 'DELETE',
  });
  assert.equal(release.status, 200);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 90_000 });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page reloaded');
  const stages = await page.locator('.stage').evaluateAll((els) =>
    els.map((e) => e.getAttribute('data-state')),
  );
  assert.deepEqual(stages, ['succeeded', 'succeeded', 'succeeded', 'succeeded']);
  // Screen readers are told each change as it comes, in a polite live region.
  const announcer = page.locator('.progress [aria-live="polite"].announcer');
  assert.equal(await announcer.getAttribute('role'), 'status');
  await page.waitForFunction(() => /Import cluster succeeded\./.test(document.querySelector('.announcer')?.textContent));
  assert.equal(await page.locator('button:text("Cancel")').count(), 0);
  await shot(page, 'operation-succeeded');
  await fitsWidth(page, 1024);

  await page.click('a:text("Open the cluster")');
  await page.waitForURL(new RegExp(`/clusters/${eks.name}$`));
  await page.waitForSelector('.cluster-facts');
  const facts = await page.textContent('.cluster-facts');
  assert.match(facts, /us-east-1/);
  assert.ok(facts.includes(eks.arn), facts);
  await shot(page, 'cluster-detail');
  await page.click('nav.tabs a:text-is("Operations")');
  await page.waitForURL(new RegExp(`/clusters/${eks.name}/operations$`));
  await page.waitForSelector('.operations tr[data-state="succeeded"]');
  await fitsWidth(page, 1024);

  await page.goto(new URL('/clusters', server.url).href);
  await page.waitForSelector(`tr[data-cluster="${eks.name}"]`);
  await page.waitForSelector('.link-connected');
  await shot(page, 'clusters');
  await page.goto(new URL('/operations', server.url).href);
  await page.waitForSelector('.operations tr[data-state="succeeded"]');
  await page.waitForSelector('.link-connected');
  await shot(page, 'operations');
  await fitsWidth(page, 1024);
  assert.deepEqual(errors, []);
});

test('a failed call shows the provider\'s message, and retry resumes the operation', async () => {
  const eks = pythonHelper('eks_world.py', [server.world.motoUrl, server.world.simUrl, 'e2e-denied']);
  // EKS refuses the next call once, with its own code and message.
  const fault = await fetch(new URL('/_sim/faults', server.world.simUrl), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      service: 'eks',
      operation: 'CreateAccessEntry',
      kind: 'error',
      code: 'AccessDeniedException',
      status: 403,
      message: 'User is not authorized to perform: eks:CreateAccessEntry',
      times: 1,
    }),
  });
  assert.equal(fault.status, 200);

  const { page, errors } = await newPage();
  await signIn(page, admin);
  await importThroughForm(page, eks.name);
  await page.waitForSelector('.progress[data-state="failed"]', { timeout: 60_000 });
  const failed = page.locator('.stage[data-state="failed"]');
  assert.equal(await failed.getAttribute('data-stage'), 'access');
  assert.equal(await failed.locator('.failing-call').textContent(), 'eks.CreateAccessEntry');
  assert.match(await failed.locator('.provider-message').textContent(), /not authorized/);
  assert.match(await failed.textContent(), /AccessDeniedException/);
  await shot(page, 'operation-failed');

  // The same panel in the dark theme, for the screenshots.
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot(page, 'operation-failed-dark');
  await page.emulateMedia({ colorScheme: 'light' });

  // The diagnosis names the refused call and offers the retry for once it is allowed;
  // it changes nothing (the operation stays failed, and retryable).
  await page.click('button.diagnose');
  await page.waitForSelector('.diagnosis');
  const findings = await page.locator('.finding').allTextContents();
  assert.match(findings[0], /AccessDeniedException/);
  assert.match(findings[1], /eks\.CreateAccessEntry/);
  assert.deepEqual(
    await page.locator('.suggestion').evaluateAll((l) => l.map((e) => e.dataset.command)),
    ['retry_operation'],
  );
  assert.equal(await page.locator('.progress').getAttribute('data-state'), 'failed');

  await page.click('button:text("Retry")');
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 60_000 });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page reloaded');
  assert.equal(await page.locator('.failing-call').count(), 0);
  assert.deepEqual(errors, []);
});

test('cancel stops an import while it waits', async () => {
  const eks = pythonHelper('eks_world.py', [
    server.world.motoUrl,
    server.world.simUrl,
    'e2e-cancel',
    'creating',
  ]);
  const { page, errors } = await newPage();
  await signIn(page, admin);
  await importThroughForm(page, eks.name);
  await page.waitForSelector('.stage[data-stage="eks"][data-state="waiting"]', { timeout: 30_000 });
  await page.click('button:text("Cancel")');
  await page.waitForSelector('.progress[data-state="cancelled"]', { timeout: 30_000 });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page reloaded');
  assert.equal(await page.locator('button:text("Cancel")').count(), 0);
  // No stage ran to completion: the cluster was never recorded.
  const stages = await page.locator('.stage').evaluateAll((els) =>
    els.map((e) => e.getAttribute('data-state')),
  );
  assert.ok(!stages.includes('succeeded'), `stages: ${stages}`);
  assert.equal(await page.getAttribute('.stage[data-stage="register"]', 'data-state'), 'cancelled');
  await shot(page, 'operation-cancelled');
  assert.deepEqual(errors, []);
});

test('an admin creates and revokes a token through the tokens form', async () => {
  const { page, errors } = await newPage({ allow: /status of 422/ });
  await signIn(page, admin, '/tokens');
  await page.waitForSelector('tr[data-token="admin"]');
  // Checked in the browser by CreateToken's own rules, shown beside the field.
  await page.fill('#name', 'bad name');
  await page.click('button:text("Create token")');
  await page.waitForSelector('.field[data-field="name"].invalid #name-error p');
  await page.fill('#name', 'e2e-operator');
  await page.selectOption('#role', 'operator');
  await page.click('button:text("Create token")');
  await page.waitForSelector('.secret-value');
  const secret = (await page.textContent('.secret-value')).trim();
  assert.match(secret, /^hypd_/);
  await page.waitForSelector('tr[data-token="e2e-operator"]');
  await shot(page, 'tokens');

  // The new secret works, and stops working once revoked.
  const [ok] = await rest(server, secret, 'GET', '/api/v1/clusters');
  assert.equal(ok, 200);
  // Revoking asks first, with what will be revoked; until confirmed the secret works.
  await page.click('button[aria-label="Revoke e2e-operator"]');
  await page.waitForSelector('[aria-label="Confirm revocation"] li[data-kind="hypd:Token"]');
  const [stillOk] = await rest(server, secret, 'GET', '/api/v1/clusters');
  assert.equal(stillOk, 200);
  await page.click('[aria-label="Confirm revocation"] button:text("Revoke token")');
  await page.waitForSelector('tr[data-token="e2e-operator"] .state-revoked');
  const [refused] = await rest(server, secret, 'GET', '/api/v1/clusters');
  assert.equal(refused, 401);
  assert.deepEqual(errors, []);
});

test('a viewer is offered no import, and the server refuses it anyway', async () => {
  // Server functions answer an error with the status REST gives it.
  const { page, errors } = await newPage();
  await signIn(page, viewer);
  assert.equal(await page.textContent('.user .role'), 'viewer');
  await page.waitForSelector('.page-head h1:text("Clusters")');
  assert.equal(await page.locator('a:text("Import cluster")').count(), 0);
  assert.equal(await page.locator('nav a:text("Tokens")').count(), 0);
  await shot(page, 'clusters-viewer');
  // The import page is gated like the create page: on the command's own role.
  await page.goto(new URL('/clusters/import', server.url).href);
  await page.waitForSelector('[data-error="forbidden"]');
  assert.match(await page.textContent('[data-error="forbidden"]'), /import_cluster needs the operator role; token e2e-viewer has viewer/);
  assert.equal(await page.locator('form').count(), 0);

  // The console's own call path, as a crafted request from the viewer's session.
  const refused = await page.evaluate(async () => {
    const res = await fetch('/fn/run_command', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ command: 'import_cluster', input: { name: 'e2e-eks' } }),
    });
    return { status: res.status, body: await res.text() };
  });
  assert.equal(refused.status, 403, refused.body);
  assert.equal(JSON.parse(refused.body).kind, 'forbidden', refused.body);
  assert.deepEqual(errors, []);
});
