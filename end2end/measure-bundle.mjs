// What each console page costs a browser with an empty cache: opens every page, signed
// in, in a fresh headless Chromium context, and reports the requests it made and the
// bytes they moved on the wire until it hydrated (compressed, with headers), and the
// time to hydrated. console-build packs each page's chunks into one file, so a page costs
// the document, the stylesheet, the entry bundle, the split loader and its pack.
//
// With MEASURE_LINK=<ms>,<bytes/s> (say 80,2000000: an SSM tunnel's round trip and
// rate), each page is opened through a link that slow as well.
//
//   node end2end/measure-bundle.mjs        (run by scripts/measure-console)
import { launchBrowser, startHypd } from './tests/support.mjs';
import { COLD_BYTES, COLD_REQUESTS, PAGES, coldLoad, sessionCookie } from './tests/budget.mjs';

const server = await startHypd({ sandbox: true });
const browser = await launchBrowser();
try {
  const cookie = await sessionCookie(server);
  // Not counted: the first page a fresh server and browser serve pays their start-up.
  await (await coldLoad(browser, server.url, '/login', null)).context.close();
  const link = process.env.MEASURE_LINK?.split(',').map(Number);
  const rows = [];
  for (const route of PAGES) {
    const who = route === '/login' ? null : cookie;
    const cold = await coldLoad(browser, server.url, route, who);
    await cold.context.close();
    if (link) {
      const slow = await coldLoad(browser, server.url, route, who, { latencyMs: link[0], bytesPerSecond: link[1] });
      await slow.context.close();
      cold.linkMs = slow.hydratedMs;
    }
    rows.push(cold);
  }
  const kB = (n) => (n / 1000).toFixed(1).padStart(7);
  console.log(`== cold page, empty cache (budget: ${COLD_REQUESTS} requests, ${COLD_BYTES / 1000} kB)`);
  const through = link ? `   through ${link[0]} ms, ${link[1] / 1e6} MB/s` : '';
  console.log(`  page                 requests   on the wire   hydrated${through}`);
  const ms = (n) => `${String(Math.round(n)).padStart(7)} ms`;
  for (const r of rows) {
    console.log(
      `  ${r.route.padEnd(22)} ${String(r.requests).padStart(5)} ${kB(r.bytes)} kB ${ms(r.hydratedMs)}${link ? `   ${ms(r.linkMs)}` : ''}`,
    );
  }
  const worst = rows.reduce((a, b) => (b.bytes > a.bytes ? b : a));
  console.log(`  largest page: ${worst.route} ${kB(worst.bytes).trim()} kB`);
} finally {
  await browser.close();
  await server.stop();
}
