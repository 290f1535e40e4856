// What each console page costs a browser with an empty cache: opens every page, signed
// in, in a fresh headless Chromium context, and reports the requests it made and the
// bytes they moved on the wire until it hydrated (compressed, with headers), and the
// time to hydrated. console-build packs each page's chunks into one file, so a page costs
// the document, the stylesheet, the entry bundle, the split loader and its pack.
//
//   node end2end/measure-bundle.mjs        (run by scripts/measure-console)
import { launchBrowser, startHypd } from './tests/support.mjs';
import { COLD_BYTES, COLD_REQUESTS, PAGES, coldLoad, sessionCookie } from './tests/budget.mjs';

const server = await startHypd({ sandbox: true });
const browser = await launchBrowser();
try {
  const cookie = await sessionCookie(server);
  const rows = [];
  for (const route of PAGES) {
    const cold = await coldLoad(browser, server.url, route, route === '/login' ? null : cookie);
    await cold.context.close();
    rows.push(cold);
  }
  const kB = (n) => (n / 1000).toFixed(1).padStart(7);
  console.log(`== cold page, empty cache (budget: ${COLD_REQUESTS} requests, ${COLD_BYTES / 1000} kB)`);
  console.log('  page                 requests   on the wire   hydrated');
  for (const r of rows) {
    console.log(
      `  ${r.route.padEnd(22)} ${String(r.requests).padStart(5)} ${kB(r.bytes)} kB ${String(Math.round(r.hydratedMs)).padStart(7)} ms`,
    );
  }
  const worst = rows.reduce((a, b) => (b.bytes > a.bytes ? b : a));
  console.log(`  largest page: ${worst.route} ${kB(worst.bytes).trim()} kB`);
} finally {
  await browser.close();
  await server.stop();
}
