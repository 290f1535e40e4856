// Starts a real `hypd serve` for a browser test and launches Debian's Chromium through
// playwright-core (browsers cannot be downloaded here, so the system one is used).
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync } from 'node:fs';
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
    stdio: ['ignore', 'pipe', 'inherit'],
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
  return {
    url,
    dataDir,
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
