// What the console shows when something goes wrong, against a sandbox hypd whose
// SageMaker refuses two cluster creations after their clusters were recorded: the list,
// the overview and the cluster's page read "create failed" (not a blue "creating"), the
// page names the failing stage with the provider's message and offers Retry and Delete
// (to operators only), Retry resumes the creation, Delete removes the other cluster. The
// overview at / lists what needs attention and what runs, and follows the live channel.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  artifacts,
  clearSimFault,
  hydrated,
  launchBrowser,
  pythonHelper,
  rest,
  signedInPage,
  simClock,
  simFault,
  startHypd,
  waitForOperation,
} from './support.mjs';

let server;
let browser;
let admin;
let viewer;
// cluster name → its creation's operation id
const creations = {};

const refusal = 'The instance group accelerated-1 cannot be created: capacity is not available';

before(async () => {
  server = await startHypd({ sandbox: true });
  browser = await launchBrowser();
  admin = server.adminToken();
  const [status, created] = await rest(server, admin, 'POST', '/api/v1/tokens', {
    name: 'e2e-attention-viewer',
    role: 'viewer',
  });
  assert.equal(status, 200, JSON.stringify(created));
  viewer = created.token;
  // 600 simulated seconds per real second: EKS and HyperPod are ready in seconds.
  await simClock(server, 600);
  // SageMaker refuses the next two CreateCluster calls, for good (not a throttle).
  await simFault(server, {
    service: 'sagemaker',
    operation: 'CreateCluster',
    kind: 'error',
    code: 'ValidationException',
    status: 400,
    message: refusal,
    times: 2,
  });
  for (const name of ['e2e-broken', 'e2e-doomed']) {
    const [s, started] = await rest(server, admin, 'POST', '/api/v1/clusters', {
      name,
      availability_zone: 'us-east-1a',
      instance_groups: [{ name: 'accelerated-1', instance_type: 'ml.g5.8xlarge', instance_count: 2 }],
    });
    assert.equal(s, 200, JSON.stringify(started));
    creations[name] = started.operation_id;
  }
  for (const id of Object.values(creations)) {
    await waitForOperation(server, admin, id, (op) => op.state === 'failed');
  }
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

async function shot(page, name) {
  await page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
}

test('a failed creation reads "create failed" in the list and on its page, with the stage', async () => {
  const { page, errors } = await signedInPage(browser, server, admin);
  await page.goto(new URL('/clusters', server.url).href);
  await hydrated(page);
  for (const name of ['e2e-broken', 'e2e-doomed']) {
    const row = page.locator(`tr[data-cluster="${name}"]`);
    assert.equal(await row.getAttribute('data-state'), 'create failed');
    assert.equal((await row.locator('.badge.state-create_failed').textContent()).trim(), 'create failed');
  }
  await shot(page, 'clusters-create-failed');

  await page.goto(new URL('/clusters/e2e-broken', server.url).href);
  await hydrated(page);
  assert.equal(await page.getAttribute('.page-head', 'data-state'), 'create failed');
  const failure = page.locator('.cluster-failure');
  assert.equal(await failure.getAttribute('data-operation'), creations['e2e-broken']);
  assert.match(await failure.locator('h2').textContent(), /^Create cluster failed at: .*HyperPod/);
  assert.equal(await failure.locator('.failing-call').textContent(), 'sagemaker.CreateCluster');
  assert.ok((await failure.locator('.provider-message').textContent()).includes(refusal));
  assert.equal(await failure.locator('button:text("Retry")').count(), 1);
  assert.equal(await failure.locator('button:text("Delete")').count(), 1);
  await shot(page, 'cluster-create-failed');
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot(page, 'cluster-create-failed-dark');
  assert.deepEqual(errors, []);
});

test('a viewer sees the failure but is offered neither Retry nor Delete', async () => {
  const { page, errors } = await signedInPage(browser, server, viewer);
  await page.goto(new URL('/clusters/e2e-broken', server.url).href);
  await hydrated(page);
  await page.waitForSelector('.cluster-failure');
  assert.equal(await page.locator('.cluster-failure button').count(), 0);
  assert.equal(await page.locator('.cluster-failure a:text("Open the operation")').count(), 1);
  assert.deepEqual(errors, []);
});

test('the overview lists what needs attention and what runs, and follows live', async () => {
  // An import held at its eks stage: something in progress.
  const eks = pythonHelper('eks_world.py', [server.world.motoUrl, server.world.simUrl, 'e2e-held', 'creating']);
  const [status, started] = await rest(server, admin, 'POST', '/api/v1/clusters/import', {
    name: eks.name,
    region: 'us-east-1',
  });
  assert.equal(status, 200, JSON.stringify(started));
  await waitForOperation(server, admin, started.operation_id, (op) =>
    op.stages.some((s) => s.state === 'waiting'),
  );

  const { page, errors } = await signedInPage(browser, server, admin);
  await page.goto(new URL('/', server.url).href);
  await hydrated(page);
  await page.waitForSelector('.link-connected');
  const attention = page.locator('.attention');
  assert.equal(await attention.getAttribute('data-count'), '2');
  for (const name of ['e2e-broken', 'e2e-doomed']) {
    const item = attention.locator(`li[data-attention="operation/${creations[name]}"]`);
    assert.match(await item.locator('.item-what').textContent(), new RegExp(`Create cluster on cluster/${name} failed at`));
    assert.ok((await item.textContent()).includes(refusal));
    assert.equal(await item.locator('a').getAttribute('href'), `/clusters/${name}`);
  }
  const running = page.locator(`.running li[data-operation="${started.operation_id}"]`);
  assert.match(await running.textContent(), /Import cluster on cluster\/e2e-held/);
  assert.equal(await running.getAttribute('data-state'), 'waiting');
  assert.equal(await page.getAttribute('.clusters tr[data-cluster="e2e-broken"]', 'data-state'), 'create failed');
  await shot(page, 'overview-attention');

  // The import moves on once EKS is ACTIVE; the overview hears it over the WebSocket.
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await clearSimFault(server, eks.fault);
  await page.waitForSelector(`.running li[data-operation="${started.operation_id}"]`, {
    state: 'detached',
    timeout: 60_000,
  });
  await page.waitForSelector('.clusters tr[data-cluster="e2e-held"]');
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page reloaded');
  assert.deepEqual(errors, []);
});

test('Retry resumes the failed creation; Delete removes the other cluster', async () => {
  const { page, errors } = await signedInPage(browser, server, admin);
  await page.goto(new URL('/clusters/e2e-broken', server.url).href);
  await hydrated(page);
  // The fault is spent: the retried HyperPod stage succeeds.
  await Promise.all([
    page.waitForURL(new URL(`/operations/${creations['e2e-broken']}`, server.url).href),
    page.click('.cluster-failure button:text("Retry")'),
  ]);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 180_000 });
  await page.goto(new URL('/clusters/e2e-broken', server.url).href);
  await hydrated(page);
  assert.equal(await page.locator('.cluster-failure').count(), 0);
  assert.equal(await page.getAttribute('.page-head', 'data-state'), 'active');

  await page.goto(new URL('/clusters/e2e-doomed', server.url).href);
  await hydrated(page);
  // Deleting asks first, showing the server's plan: what the deletion will remove.
  await page.click('.cluster-failure button:text("Delete")');
  await page.waitForSelector('.cluster-failure .confirm .plan li[data-kind="hypd:Cluster"]');
  assert.match(await page.textContent('.cluster-failure .confirm'), /Delete e2e-doomed and everything hypd created for it\?/);
  assert.ok(await page.locator('.cluster-failure .plan li[data-action="delete"]').count() >= 1);
  await page.click('.cluster-failure button:text("Keep it")');
  assert.equal(await page.locator('.cluster-failure .confirm').count(), 0);
  await page.click('.cluster-failure button:text("Delete")');
  await Promise.all([
    page.waitForURL(/\/operations\/[^/]+$/),
    page.click('.cluster-failure button:text("Delete cluster")'),
  ]);
  const deletion = new URL(page.url()).pathname.split('/').pop();
  assert.notEqual(deletion, creations['e2e-doomed']);
  await page.waitForSelector('.progress h1:text("Delete cluster")');
  await waitForOperation(server, admin, deletion, (op) => op.state === 'succeeded');
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 60_000 });

  // The overview now: nothing needs attention, and the retried cluster's nodes were
  // observed when its creation finished.
  await page.goto(new URL('/', server.url).href);
  await hydrated(page);
  assert.equal(await page.getAttribute('.attention', 'data-count'), '0');
  const counts = page.locator('.clusters tr[data-cluster="e2e-broken"] .node-counts');
  assert.equal(await counts.getAttribute('data-healthy'), '2');
  assert.equal(await page.locator('.clusters tr[data-cluster="e2e-doomed"]').count(), 0);
  await shot(page, 'overview-clear');
  assert.deepEqual(errors, []);
});
