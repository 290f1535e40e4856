// What a console page costs a browser reached through a tunnel: every request a page
// makes until it has hydrated, and the bytes they moved on the wire (compressed bodies
// plus headers, as Chromium counts them), with an empty cache. Shared by the budget test
// (console-shell.test.mjs) and the measurement script (end2end/measure-bundle.mjs).

// The budget (issue 34): a cold page in at most this many requests and bytes, a
// navigation inside the console in at most this many requests.
export const COLD_REQUESTS = 15;
export const COLD_BYTES = 300_000;
export const WARM_REQUESTS = 3;
// Every page of the console, signed in, with the bytes it cost when last measured (the
// bundle scripts/run builds; `scripts/measure-console` prints them). A name and an id
// that do not exist still load the page's code, which is what counts.
//
// Not yet COLD_BYTES: the entry bundle alone (router, reactive runtime, renderer, serde)
// is ~244 kB brotli before any page's code, see issue 34's notes. The test holds each
// page to its own figure plus BYTES_MARGIN, so a page that grows fails CI; lower a
// figure when a page shrinks.
export const PAGES = [
  ['/', 376_000],
  ['/login', 327_000],
  ['/clusters', 350_000],
  ['/clusters/new', 456_000],
  ['/clusters/import', 418_000],
  ['/clusters/measure', 432_000],
  ['/clusters/measure/nodes', 512_000],
  ['/clusters/measure/features', 435_000],
  ['/clusters/measure/storage', 491_000],
  ['/clusters/measure/models', 435_000],
  ['/clusters/measure/training', 524_000],
  ['/clusters/measure/inference', 523_000],
  ['/clusters/measure/drift', 416_000],
  ['/clusters/measure/operations', 416_000],
  ['/endpoints', 334_000],
  ['/operations', 342_000],
  ['/operations/measure', 368_000],
  ['/tokens', 423_000],
];
export const BYTES_MARGIN = 1.05;

// Signs in over the API; the session cookie, for browser contexts.
export async function sessionCookie(server) {
  const login = await fetch(new URL('/auth/login', server.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token: server.adminToken() }),
  });
  if (!login.ok) throw new Error(`sign-in answered ${login.status}`);
  const [name, value] = login.headers.get('set-cookie').split(';')[0].split('=');
  return { name, value, domain: new URL(server.url).hostname, path: '/' };
}

// Counts what `page` fetches from now on: `take()` answers the requests and bytes so far
// (each request's headers and encoded body, both ways) and starts counting afresh.
export function meter(page) {
  let pending = [];
  let issued = [];
  // Requested, whether finished or not: the live channel never finishes.
  page.on('request', (r) => issued.push(new URL(r.url()).pathname));
  page.on('requestfinished', (r) => {
    pending.push(
      r.sizes().then(
        (s) => ({ url: r.url(), bytes: s.requestHeadersSize + s.requestBodySize + s.responseHeadersSize + s.responseBodySize }),
        () => ({ url: r.url(), bytes: 0 }),
      ),
    );
  });
  page.on('requestfailed', (r) => pending.push(Promise.resolve({ url: r.url(), bytes: 0, failed: true })));
  return {
    async take() {
      const done = await Promise.all(pending);
      const urls = issued;
      pending = [];
      issued = [];
      return { requests: urls.length, bytes: done.reduce((n, d) => n + d.bytes, 0), urls };
    },
  };
}

// How long after hydration a page's own first requests are waited for.
const SETTLE_MS = 500;

// The moment the page says it hydrated, in ms since navigation began, recorded by the
// page itself (a poll from outside would add its own interval).
const HYDRATION_CLOCK = () => {
  new MutationObserver((_, observer) => {
    if (document.documentElement.dataset.hydrated === 'true') {
      window.__hydratedAt = performance.now();
      observer.disconnect();
    }
  // The document element may not exist yet when this runs: watch the whole document.
  }).observe(document, { subtree: true, attributes: true, attributeFilter: ['data-hydrated'] });
};

// Opens `route` in a fresh context (empty cache) signed in with `cookie`, waits until it
// has hydrated and what it asks for at once; answers its requests, bytes and time to
// hydrated, with the page still open (close `context` when done).
// With `link` ({ latencyMs, bytesPerSecond }), Chromium holds each request that long and
// the transfer to that rate, as a tunnel would (its own network emulation; the measurement
// script's other way is a real link, end2end/tunnel.mjs).
export async function coldLoad(browser, baseUrl, route, cookie, link) {
  const context = await browser.newContext();
  if (cookie) await context.addCookies([cookie]);
  const page = await context.newPage();
  if (link) {
    const cdp = await context.newCDPSession(page);
    await cdp.send('Network.enable');
    await cdp.send('Network.emulateNetworkConditions', {
      offline: false,
      latency: link.latencyMs,
      downloadThroughput: link.bytesPerSecond,
      uploadThroughput: link.bytesPerSecond,
    });
  }
  await page.addInitScript(HYDRATION_CLOCK);
  const m = meter(page);
  await page.goto(new URL(route, baseUrl).href);
  await page.waitForSelector('html[data-hydrated="true"]', { timeout: 60_000 });
  await page.waitForLoadState('load');
  // What a hydrated page asks for at once (its live channel, data it loads) counts too.
  await page.waitForTimeout(SETTLE_MS);
  const hydratedMs = await page.evaluate(() => window.__hydratedAt);
  const cost = await m.take();
  return { route, ...cost, hydratedMs, page, context, meter: m };
}
