// Starts a real `hypd serve` for a browser test and launches Debian's Chromium through
// playwright-core (browsers cannot be downloaded here, so the system one is used).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const targetDir = process.env.CARGO_TARGET_DIR || path.join(repo, 'target');

export const artifacts = path.join(repo, 'target', 'e2e');
mkdirSync(artifacts, { recursive: true });

export async function startHypd({ sandbox = true } = {}) {
  const bin = process.env.HYPD_BIN || path.join(targetDir, 'debug', 'hypd');
  const dataDir = mkdtempSync(path.join(tmpdir(), 'hypd-e2e-'));
  const args = ['serve', '--port', '0'];
  if (sandbox) args.push('--sandbox');
  const child = spawn(bin, args, {
    env: {
      ...process.env,
      HYPD_DATA_DIR: dataDir,
      HYPD_SITE_ROOT: process.env.HYPD_SITE_ROOT || path.join(repo, 'target', 'site'),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // The sandbox names its moto and sim in a log line; tests steer the world through them.
  const world = {};
  let errBuf = '';
  child.stderr.on('data', (chunk) => {
    process.stderr.write(chunk);
    if (world.simUrl) return;
    errBuf += String(chunk).replace(/\x1b\[[0-9;]*m/g, '');
    const moto = errBuf.match(/moto=(http:\/\/[0-9.:]+)/);
    const sim = errBuf.match(/sim=(http:\/\/[0-9.:]+)/);
    if (moto) world.motoUrl = moto[1];
    if (sim) world.simUrl = sim[1];
  });
  const url = await new Promise((resolve, reject) => {
    let buf = '';
    const timer = setTimeout(() => reject(new Error('hypd did not start within 60 s')), 60_000);
    child.stdout.on('data', (chunk) => {
      buf += chunk;
      const m = buf.match(/hypd listening on (http:\/\/\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`hypd exited with ${code} before listening`));
    });
  });
  const stateDir = sandbox ? path.join(dataDir, 'sandbox') : dataDir;
  return {
    url,
    dataDir,
    world,
    adminToken: () => readFileSync(path.join(stateDir, 'admin-token'), 'utf8').trim(),
    async stop() {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    },
  };
}

export async function launchBrowser(executablePath = process.env.CHROMIUM || '/usr/bin/chromium') {
  return chromium.launch({
    executablePath,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

// Calls a REST command with a bearer token; returns [status, body].
export async function rest(server, token, method, route, body) {
  const res = await fetch(new URL(route, server.url), {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return [res.status, await res.json()];
}

// Runs the Python helper that builds AWS-side fixtures in the sandbox's moto and sim.
export function pythonHelper(script, args) {
  const venv = process.env.HYPD_VENV || path.join(process.env.HOME, '.cache', 'hypd', 'venv');
  const python = path.join(venv, 'bin', 'python');
  const out = execFileSync(python, [path.join(repo, 'end2end', 'tests', script), ...args], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    timeout: 120_000,
  });
  return JSON.parse(out);
}

export async function hydrated(page) {
  await page.waitForSelector('html[data-hydrated="true"]', { timeout: 60_000 });
}

// A page in a fresh browser context (empty cache) signed in with `token`'s session cookie,
// and the errors it logs. `allow` matches console errors a test provokes on purpose.
export async function signedInPage(browser, server, token, { allow, viewport } = {}) {
  const login = await fetch(new URL('/auth/login', server.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token }),
  });
  assert.equal(login.status, 200, 'sign-in');
  const [name, value] = login.headers.get('set-cookie').split(';')[0].split('=');
  const context = await browser.newContext({ viewport: viewport || { width: 1280, height: 800 } });
  await context.addCookies([{ name, value, domain: new URL(server.url).hostname, path: '/' }]);
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => m.type() === 'error' && !(allow && allow.test(m.text())) && errors.push(m.text()));
  return { page, errors, context };
}

// Polls an operation through REST until `done(operation)` holds (or the time is up).
export async function waitForOperation(server, token, id, done, { seconds = 180 } = {}) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const [status, op] = await rest(server, token, 'GET', `/api/v1/operations/${id}`);
    assert.equal(status, 200, JSON.stringify(op));
    if (done(op)) return op;
    if (Date.now() > deadline) throw new Error(`operation ${id} is still ${op.state}: ${JSON.stringify(op.stages.map((s) => [s.name, s.state]))}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

// Sets the sim's clock: simulated seconds per real second.
export async function simClock(server, timeScale) {
  const res = await fetch(new URL('/_sim/clock', server.world.simUrl), {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ time_scale: timeScale }),
  });
  assert.equal(res.status, 200);
}

// Adds a fault to the sim; returns its id.
export async function simFault(server, fault) {
  const res = await fetch(new URL('/_sim/faults', server.world.simUrl), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(fault),
  });
  assert.equal(res.status, 200);
  return (await res.json()).id;
}

export async function clearSimFault(server, id) {
  const res = await fetch(new URL(`/_sim/faults/${id}`, server.world.simUrl), { method: 'DELETE' });
  assert.equal(res.status, 200);
}
