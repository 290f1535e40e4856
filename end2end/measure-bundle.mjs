// What each console page costs a browser with an empty cache: opens every page, signed
// in, in a fresh headless Chromium context, and reports the requests it made and the
// bytes they moved on the wire until it hydrated (compressed, with headers), and the
// time to hydrated. console-build packs each page's chunks into one file, so a page costs
// the document, the stylesheet, the entry bundle, the split loader and its pack.
//
// With MEASURE_LINK=<ms>,<bytes/s> (say 80,2000000: an SSM tunnel's round trip and
// rate), each page is opened through Chromium's own emulation of a link that slow as
// well; with MEASURE_TUNNEL=<ms>,<bytes/s> (as root), through a network namespace and a
// delaying relay (end2end/tunnel.mjs), by a second Chromium inside the namespace.
// MEASURE_PAGES=<route>,… measures only those pages of budget.mjs's list.
//
//   node end2end/measure-bundle.mjs        (run by scripts/measure-console)
import { launchBrowser, startHypd } from './tests/support.mjs';
import { openTunnel } from './tunnel.mjs';
import { COLD_BYTES, COLD_REQUESTS, PAGES, coldLoad, sessionCookie } from './tests/budget.mjs';

const tunnelLink = process.env.MEASURE_TUNNEL?.split(',').map(Number);
const tunnel = tunnelLink ? await openTunnel({ rttMs: tunnelLink[0], bytesPerSecond: tunnelLink[1] }) : null;
// hypd answers loopback names only, unless told of the tunnel's end.
if (tunnel) process.env.HYPD_ALLOWED_HOSTS = `${tunnel.host},127.0.0.1,localhost`;
const server = await startHypd({ sandbox: true });
const browser = await launchBrowser();
let tunnelBrowser = null;
let tunnelUrl = null;
let tunnelCookie = null;
try {
  const cookie = await sessionCookie(server);
  // Not counted: the first page a fresh server and browser serve pays their start-up.
  await (await coldLoad(browser, server.url, '/login', null)).context.close();
  const link = process.env.MEASURE_LINK?.split(',').map(Number);
  if (tunnel) {
    tunnelUrl = tunnel.forwardTo(server.url);
    tunnelBrowser = await launchBrowser(tunnel.chromium);
    tunnelCookie = { ...cookie, domain: tunnel.host };
    // Its start-up is not counted either.
    await (await coldLoad(tunnelBrowser, tunnelUrl, '/login', null)).context.close();
  }
  const rows = [];
  // MEASURE_PAGES=/,/login,… measures those pages only (an older build lacks some).
  const only = process.env.MEASURE_PAGES?.split(',');
  for (const [route, bytesNow] of PAGES.filter(([r]) => !only || only.includes(r))) {
    const who = route === '/login' ? null : cookie;
    const cold = await coldLoad(browser, server.url, route, who);
    await cold.context.close();
    if (link) {
      const slow = await coldLoad(browser, server.url, route, who, { latencyMs: link[0], bytesPerSecond: link[1] });
      await slow.context.close();
      cold.linkMs = slow.hydratedMs;
    }
    if (tunnel) {
      const far = await coldLoad(tunnelBrowser, tunnelUrl, route, who && tunnelCookie);
      await far.context.close();
      cold.tunnelMs = far.hydratedMs;
    }
    rows.push({ ...cold, bytesNow });
  }
  const kB = (n) => (n / 1000).toFixed(1).padStart(7);
  console.log(`== cold page, empty cache (budget: ${COLD_REQUESTS} requests, ${COLD_BYTES / 1000} kB)`);
  // One column per way of opening the page, each headed by what it went through.
  const cols = [['hydrated', (r) => r.hydratedMs]];
  if (link) cols.push([`emulated ${link[0]} ms, ${link[1] / 1e6} MB/s`, (r) => r.linkMs]);
  if (tunnelLink) cols.push([`tunnel ${tunnelLink[0]} ms, ${tunnelLink[1] / 1e6} MB/s`, (r) => r.tunnelMs]);
  const ms = (n, w) => `${Math.round(n)} ms`.padStart(w);
  console.log(`  page                            requests   on the wire (held to)   ${cols.map(([h]) => h.padStart(10)).join('   ')}`);
  for (const r of rows) {
    const times = cols.map(([h, at]) => ms(at(r), Math.max(10, h.length))).join('   ');
    console.log(`  ${r.route.padEnd(32)} ${String(r.requests).padStart(5)} ${kB(r.bytes)} kB (${kB(r.bytesNow).trim()})   ${times}`);
  }
  const worst = rows.reduce((a, b) => (b.bytes > a.bytes ? b : a));
  console.log(`  largest page: ${worst.route} ${kB(worst.bytes).trim()} kB`);
} finally {
  await tunnelBrowser?.close();
  await tunnel?.close();
  await browser.close();
  await server.stop();
}
