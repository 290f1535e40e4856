// Starts a real `hypd serve` for a browser test and launches Debian's Chromium through
// playwright-core (browsers cannot be downloaded here, so the system one is used).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

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

export async function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
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
