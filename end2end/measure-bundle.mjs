// What a browser downloads to hydrate each console page: opens every page, signed in, in
// a fresh headless Chromium context (empty cache), waits until it is hydrated, and sums
// the gzip -9 size of each wasm and JS file it fetched from /pkg/ (and, for reference,
// the uncompressed size). console-build splits the console per page, so a page costs
// the entry bundle plus its own chunks.
//
//   node end2end/measure-bundle.mjs        (run by scripts/measure-console)
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { launchBrowser, startHypd } from './tests/support.mjs';

const pages = [
  '/',
  '/login',
  '/clusters',
  '/clusters/new',
  '/clusters/import',
  // A name and an id that do not exist still load the page's code, which is what counts.
  '/clusters/measure',
  '/operations',
  '/operations/measure',
  '/tokens',
];
const aim = 400_000;

const server = await startHypd({ sandbox: true });
const browser = await launchBrowser();
const site = process.env.HYPD_SITE_ROOT;
const sizes = new Map();
function size(file) {
  if (!sizes.has(file)) {
    const bytes = readFileSync(path.join(site, file));
    sizes.set(file, { raw: bytes.length, gz: gzipSync(bytes, { level: 9 }).length });
  }
  return sizes.get(file);
}
const gz = (file) => size(file).gz;

try {
  const login = await fetch(new URL('/auth/login', server.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token: server.adminToken() }),
  });
  if (!login.ok) throw new Error(`sign-in answered ${login.status}`);
  const [name, value] = login.headers.get('set-cookie').split(';')[0].split('=');
  const host = new URL(server.url).hostname;

  const everything = new Set();
  const rows = [];
  for (const route of pages) {
    const context = await browser.newContext();
    await context.addCookies([{ name, value, domain: host, path: '/' }]);
    const page = await context.newPage();
    const fetched = new Set();
    page.on('response', (r) => {
      const p = new URL(r.url()).pathname;
      if (p.startsWith('/pkg/') && /\.(wasm|js)$/.test(p) && r.ok()) fetched.add(p);
    });
    await page.goto(new URL(route, server.url).href);
    await page.waitForSelector('html[data-hydrated="true"]', { timeout: 60_000 });
    await context.close();
    const files = [...fetched];
    files.forEach((f) => everything.add(f));
    const entry = files.filter((f) => /\/(hypd\.(wasm|js)|__wasm_split[^/]*\.js)$/.test(f));
    const entryBytes = entry.reduce((n, f) => n + gz(f), 0);
    const total = files.reduce((n, f) => n + gz(f), 0);
    const raw = files.reduce((n, f) => n + size(f).raw, 0);
    rows.push({ route, files: files.length, entryBytes, chunkBytes: total - entryBytes, total, raw });
  }

  const kB = (n) => (n / 1000).toFixed(1).padStart(7);
  console.log('== hydrate download per page (wasm + JS, gzip -9, empty cache)');
  console.log('  page                   files     entry    chunks     total   (uncompressed)');
  for (const r of rows) {
    console.log(
      `  ${r.route.padEnd(22)} ${String(r.files).padStart(5)} ${kB(r.entryBytes)} kB ${kB(r.chunkBytes)} kB ${kB(r.total)} kB ${kB(r.raw)} kB`,
    );
  }
  const worst = rows.reduce((a, b) => (b.total > a.total ? b : a));
  const all = [...everything].reduce((n, f) => n + gz(f), 0);
  console.log(`  largest page: ${worst.route} ${kB(worst.total).trim()} kB (aim: under ${aim / 1000} kB)`);
  console.log(`  every page visited once: ${everything.size} files, ${kB(all).trim()} kB`);
} finally {
  await browser.close();
  await server.stop();
}
