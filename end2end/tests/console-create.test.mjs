// Creating a cluster through the console in headless Chromium against a sandbox hypd:
// the form's choices come from inspection, instance groups are added and removed, a bad
// field is refused beside it (by the request type's own rules in the browser, and by the
// server's pre-flight), also inside the second group, the progress panel reaches
// "succeeded" live, and the cluster's page shows both instance groups and their nodes.
// A viewer is offered no create button and the server refuses the call anyway.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { artifacts, launchBrowser, rest, startHypd, waitForOperation } from './support.mjs';

let server;
let browser;
let admin;
let viewer;

before(async () => {
  server = await startHypd({ sandbox: true });
  browser = await launchBrowser();
  admin = server.adminToken();
  // 600 simulated seconds per real second: EKS and HyperPod are ready in seconds.
  const clock = await fetch(new URL('/_sim/clock', server.world.simUrl), {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ time_scale: 600 }),
  });
  assert.equal(clock.status, 200);
  const [status, created] = await rest(server, admin, 'POST', '/api/v1/tokens', {
    name: 'e2e-create-viewer',
    role: 'viewer',
  });
  assert.equal(status, 200, JSON.stringify(created));
  viewer = created.token;
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

async function newPage() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  // Refusals the tests provoke on purpose are logged by Chromium as failed loads.
  const provoked = /Failed to load resource: the server responded with a status of (403|409|422)/;
  page.on('console', (m) => m.type() === 'error' && !provoked.test(m.text()) && errors.push(m.text()));
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

// The page has asked AWS for everything it shows, including the refresh the live
// channel's connection triggers: what the user types from here is not drawn over.
async function settled(page) {
  await page.waitForSelector('.link-connected');
  await page.waitForLoadState('networkidle');
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
}

async function fitsWidth(page, width) {
  const size = page.viewportSize();
  await page.setViewportSize({ width, height: size.height });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  await page.setViewportSize(size);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a ${width}px window`);
}

// Opens the form and fills a valid request for `name` (nothing submitted yet).
async function fillForm(page, name) {
  await page.goto(new URL('/clusters/new', server.url).href);
  await hydrated(page);
  await page.waitForSelector('#region option[value="us-east-1"]', { state: 'attached' });
  await page.waitForSelector('#availability_zone option[value="us-east-1a"]', { state: 'attached' });
  await page.fill('#name', name);
  await page.selectOption('#availability_zone', 'us-east-1a');
  // Instance types follow the zone: only what it offers, with GPU and EFA facts.
  await page.waitForSelector('#instance_groups-0-instance_type option[value="ml.g5.8xlarge"]', { state: 'attached' });
  await page.selectOption('#instance_groups-0-instance_type', 'ml.g5.8xlarge');
  await page.fill('#instance_groups-0-instance_count', '2');
}

test('an admin creates a cluster through the form and watches it succeed live', async () => {
  const { page, errors } = await newPage();
  // The console is split per page (by console-build), one pack of code per page: what
  // this page fetched.
  const fetched = [];
  page.on('request', (r) => fetched.push(new URL(r.url()).pathname));
  await signIn(page, admin);
  assert.ok(fetched.some((p) => /^\/pkg\/pack_cluster_list_route_view_\w+\.wasm$/.test(p)));
  assert.ok(!fetched.some((p) => p.includes('create_cluster_route')), 'the list loaded the create form\'s code');
  await page.click('a:text("Create cluster")');
  await page.waitForURL(/\/clusters\/new$/);
  await hydrated(page);
  await fillForm(page, 'e2e-ml');
  const label = await page.textContent('#instance_groups-0-instance_type option[value="ml.g5.8xlarge"]');
  assert.match(label, /NVIDIA A10G/);
  assert.match(label, /EFA/);
  assert.match(await page.textContent('fieldset.group .type-facts'), /vCPU/);
  // g5.8xlarge has one EFA card: EFA-only is not offered for it.
  assert.equal(await page.locator('#instance_groups-0-efa_only').count(), 0);
  // One group to start with, which cannot be removed.
  assert.equal(await page.locator('fieldset.group').count(), 1);
  assert.equal(await page.locator('button.remove-group').count(), 0);
  assert.equal(await page.inputValue('#instance_groups-0-name'), 'accelerated-1');
  // The account's quota of the type, what its clusters use and what is free, on demand.
  await page.click('button.show-capacity');
  const quota = '.capacity-quotas tr[data-type="ml.g5.8xlarge"]';
  await page.waitForSelector(quota);
  const [limit, used, free] = await page.locator(`${quota} td.num`).allTextContents();
  assert.ok(Number(limit) > 0 && Number(free) === Number(limit) - Number(used), `${limit} ${used} ${free}`);
  await shot(page, 'create-form');

  assert.ok(fetched.some((p) => p.includes('create_cluster_route')));
  // The browser-side check is a chunk of its own, fetched on the first submit.
  assert.ok(!fetched.some((p) => p.includes('check_create')), 'the check loaded before a submit');

  // Checked in the browser by CreateCluster's own rules, shown beside the field.
  await page.fill('#instance_groups-0-instance_count', '0');
  const before = fetched.length;
  await page.click('button[type="submit"]');
  await page.waitForSelector(
    '.field[data-field="instance_groups[0].instance_count"].invalid #instance_groups-0-instance_count-error p',
  );
  const submitted = fetched.slice(before);
  assert.ok(submitted.some((p) => /^\/pkg\/pack_check_create_\w+\.wasm$/.test(p)), submitted.join(' '));
  assert.ok(!submitted.some((p) => p.startsWith('/fn/')), 'a browser-checked mistake reached the server');
  assert.match(await page.textContent('#instance_groups-0-instance_count-error'), /at least 1/);
  assert.equal(await page.getAttribute('#instance_groups-0-instance_count', 'aria-invalid'), 'true');
  assert.equal(await page.locator('.field.invalid').count(), 1);
  await shot(page, 'create-form-error');
  await page.fill('#instance_groups-0-instance_count', '2');

  // A second group: its own inputs under instance_groups[1], each group removable while
  // there are two. A name the first group has is refused beside the second's name.
  await page.click('button:text("Add another group")');
  await page.waitForSelector('fieldset.group >> nth=1');
  assert.equal(await page.inputValue('#instance_groups-1-name'), 'accelerated-2');
  assert.equal(await page.locator('button.remove-group').count(), 2);
  await page.click('button[aria-label="Remove instance group 2"]');
  // The last group cannot be removed: its button goes.
  await page.waitForSelector('button.remove-group', { state: 'detached' });
  assert.equal(await page.locator('fieldset.group').count(), 1);
  await page.click('button:text("Add another group")');
  await page.waitForSelector('#instance_groups-1-instance_type option[value="ml.g5.8xlarge"]', { state: 'attached' });
  await page.selectOption('#instance_groups-1-instance_type', 'ml.g5.8xlarge');
  await page.fill('#instance_groups-1-name', 'accelerated-1');
  const beforeSecond = fetched.length;
  await page.click('button[type="submit"]');
  await page.waitForSelector('.field[data-field="instance_groups[1].name"].invalid #instance_groups-1-name-error p');
  assert.match(await page.textContent('#instance_groups-1-name-error'), /already named accelerated-1/);
  assert.ok(!fetched.slice(beforeSecond).some((p) => p.startsWith('/fn/')), 'a browser-checked mistake reached the server');
  assert.equal(await page.locator('.field.invalid').count(), 1);
  await page.fill('#instance_groups-1-name', 'spot-1');
  await page.check('#instance_groups-1-capacity-type-spot');
  await page.fill('#instance_groups-1-instance_count', '1');
  // A training plan the account does not have: the server's pre-flight names a field of
  // the second group, and the error is shown inside that group.
  await page.check('#instance_groups-1-capacity-type-training_plan');
  await page.fill(
    '#instance_groups-1-capacity-training_plan_arn',
    'arn:aws:sagemaker:us-east-1:123456789012:training-plan/no-such-plan',
  );
  await page.click('button[type="submit"]');
  await page.waitForSelector('fieldset.group >> nth=1 >> .field.invalid .field-error p');
  assert.match(
    await page.textContent('#instance_groups-1-capacity-training_plan_arn-error'),
    /no training plan no-such-plan/,
  );
  assert.equal(await page.locator('fieldset.group >> nth=0 >> .field.invalid').count(), 0);
  assert.equal(await page.locator('.form-alert').count(), 0);
  await shot(page, 'create-form-group-server-error');
  await page.check('#instance_groups-1-capacity-type-spot');
  assert.equal(await page.locator('#instance_groups-1-capacity-training_plan_arn').count(), 0);

  // The server's pre-flight refuses a VPC block that overlaps one of the region's (moto's
  // default VPC): beside the field, inside the disclosure, which opens to show it.
  await page.click('details.advanced summary');
  await page.fill('#network-vpc_cidr', '172.31.0.0/16');
  await page.click('details.advanced summary');
  assert.equal(await page.$eval('details.advanced', (d) => d.open), false);
  await page.click('button[type="submit"]');
  await page.waitForSelector('.field[data-field="network.vpc_cidr"].invalid #network-vpc_cidr-error p');
  assert.match(await page.textContent('#network-vpc_cidr-error'), /overlaps/);
  assert.equal(await page.$eval('details.advanced', (d) => d.open), true);
  assert.equal(await page.locator('.form-alert').count(), 0);
  await shot(page, 'create-form-server-error');

  // Keyboard only from here: clear the block and submit with Enter.
  await page.focus('#network-vpc_cidr');
  await page.keyboard.press('Control+A');
  await page.keyboard.press('Backspace');
  await page.focus('#name');
  await page.keyboard.press('Enter');
  // The first submit only plans: every object each stage would make, nothing made yet.
  await page.waitForSelector('.review .plan li[data-kind="ec2:Vpc"][data-action="create"]');
  for (const kind of ['eks:Cluster', 'sagemaker:Cluster', 'hypd:Cluster']) {
    assert.equal(await page.locator(`.review .plan li[data-kind="${kind}"]`).count(), 1, kind);
  }
  assert.equal(await page.textContent('button[type="submit"]'), 'Create cluster');
  assert.match(page.url(), /\/clusters\/new$/);
  await shot(page, 'create-form-plan');
  await page.focus('#name');
  await page.keyboard.press('Enter');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await page.waitForSelector('.link-connected');
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 180_000 });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page reloaded');
  const stages = await page.locator('.stage').evaluateAll((els) => els.map((e) => e.getAttribute('data-state')));
  assert.ok(stages.length >= 5 && stages.every((s) => s === 'succeeded'), `stages: ${stages}`);
  await shot(page, 'create-operation-succeeded');

  await page.click('a:text("Open the cluster")');
  await page.waitForURL(/\/clusters\/e2e-ml$/);
  await page.waitForSelector('.cluster-facts');
  // The groups and nodes are a tab of the cluster's page, with an address of its own.
  await page.click('nav.tabs a:text-is("Instance groups and nodes")');
  await page.waitForURL(/\/clusters\/e2e-ml\/nodes$/);
  assert.equal(await page.getAttribute('nav.tabs a[aria-current="page"]', 'href'), '/clusters/e2e-ml/nodes');
  await page.waitForSelector('.instance-groups tr[data-group="accelerated-1"]');
  const group = await page.textContent('.instance-groups tr[data-group="accelerated-1"]');
  assert.match(group, /ml\.g5\.8xlarge/);
  assert.match(group, /\/ 2/);
  assert.match(await page.textContent('.instance-groups tr[data-group="spot-1"]'), /\/ 1/);
  // The nodes finish starting a little after the cluster is InService.
  for (let i = 0; i < 60; i++) {
    if ((await page.locator('.nodes tr[data-health="healthy"]').count()) === 3) break;
    await page.waitForTimeout(500);
    await page.click('button:text("Refresh")');
  }
  assert.equal(await page.locator('.nodes tr[data-health="healthy"]').count(), 3);
  assert.match(await page.textContent('.nodes tbody'), /accelerated-1/);
  assert.match(await page.textContent('.nodes tbody'), /spot-1/);
  assert.equal(await page.getAttribute('.node-counts', 'data-healthy'), '3');
  await shot(page, 'cluster-detail-live');
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot(page, 'cluster-detail-live-dark');
  await page.emulateMedia({ colorScheme: 'light' });
  await fitsWidth(page, 1024);
  await page.click('nav.tabs a:text-is("Overview")');
  await page.waitForURL(/\/clusters\/e2e-ml$/);
  await page.waitForSelector('.addons tr[data-addon]');
  assert.ok((await page.locator('.addons tr[data-addon]').count()) >= 4);
  await page.click('nav.tabs a:text-is("Drift")');
  await page.waitForURL(/\/clusters\/e2e-ml\/drift$/);

  // Drift, asked for: nothing yet. An add-on deleted behind hypd's back (the EKS API,
  // as the AWS CLI would call it) is then named, and Reconcile shows its plan before it
  // puts it back.
  await page.click('button.check-drift');
  await page.waitForSelector('.drift .drift-none');
  const removed = await fetch(new URL('/clusters/e2e-ml/addons/metrics-server', server.world.simUrl), { method: 'DELETE' });
  assert.equal(removed.status, 200, await removed.text());
  await page.click('button.check-drift');
  await page.waitForSelector('.drift-list li[data-kind="eks:Addon"][data-state="missing"]');
  await shot(page, 'cluster-drift');
  await page.click('button.reconcile');
  await page.waitForSelector('.drift .plan li[data-kind="eks:Addon"][data-action="create"]');
  assert.equal(await page.textContent('button.reconcile'), 'Run reconcile');
  await page.click('button.reconcile');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/drift', server.url).href);
  await hydrated(page);
  await page.click('button.check-drift');
  await page.waitForSelector('.drift .drift-none');

  // Advanced features: the training and inference operators, tiered checkpointing (30%
  // of memory), autoscaling of the spot group and the KubeRay operator turned on after
  // their plan (only the toggles touched are sent: the plan has the operators' add-ons
  // and the FSx driver the inference operator needs, no other), then all five off after
  // their plan and confirmation; the panel reads each state back from AWS and
  // Kubernetes. KEDA, untouched, comes and goes with the inference operator's add-on.
  const training = '.feature[data-feature="training_operator"]';
  const inference = '.feature[data-feature="inference_operator"]';
  const tiered = '.feature[data-feature="tiered_checkpointing"]';
  const scaling = '.feature[data-feature="autoscaling"]';
  const ray = '.feature[data-feature="kuberay_operator"]';
  const keda = '.feature[data-feature="keda"]';
  await page.goto(new URL('/clusters/e2e-ml/features', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`${training}[data-state="off"]`);
  await settled(page);
  assert.ok(await page.isDisabled('button.apply-features'), 'nothing touched, nothing to send');
  await page.check(`${training} .feature-toggle`);
  await page.check(`${inference} .feature-toggle`);
  await page.check(`${tiered} .feature-toggle`);
  await page.fill(`${tiered} .tiered-percent`, '30');
  assert.match(await page.textContent(scaling), /never other EC2 capacity/);
  await page.check(`${scaling} .feature-toggle`);
  await page.fill(`${scaling} .autoscaling-groups`, 'spot-1');
  await page.check(`${ray} .feature-toggle`);
  await page.click('button.apply-features');
  await page.waitForSelector('.features .plan li[data-kind="eks:Addon"][data-action="create"]');
  await page.waitForSelector('.features .plan li[data-kind="k8s:apiextensions.k8s.io/v1/CustomResourceDefinition"][data-action="create"]');
  await page.waitForSelector('.features .plan li[data-kind="k8s:karpenter.sh/v1/NodePool"][data-action="create"]');
  await page.waitForSelector('.features .plan li[data-kind="s3:Bucket"][data-action="create"]');
  assert.equal(await page.locator('.features .plan li[data-kind="eks:Addon"]').count(), 3);
  assert.match(await page.textContent('.features .plan li[data-kind="sagemaker:Cluster"]'), /30% of instance memory/);
  assert.equal(await page.textContent('button.apply-features'), 'Apply');
  await shot(page, 'features-plan');
  await page.click('button.apply-features');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/features', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`${training}[data-state="on"]`);
  await page.waitForSelector(`${inference}[data-state="on"] .feature-details li:text("controller available")`);
  await page.waitForSelector(`${tiered}[data-state="on"] .feature-details li:text("30% of instance memory")`);
  await page.waitForSelector(`${scaling}[data-state="on"] .feature-details li:text("scales instance groups spot-1")`);
  await page.waitForSelector(`${ray}[data-state="on"] .feature-details li:text("Deployment default/kuberay-operator available")`);
  await page.waitForSelector(`${keda}[data-state="on"]`);
  await settled(page);
  await shot(page, 'features-on');
  // The groups of autoscaling already on can be changed from the panel: the group it
  // scales already is nothing to do; cleared, the field is no change at all.
  await page.fill(`${scaling} .autoscaling-groups`, 'spot-1');
  await page.click('button.apply-features');
  await page.waitForSelector('.features .plan p:text("Nothing to do")');
  await page.fill(`${scaling} .autoscaling-groups`, '');
  assert.ok(await page.isDisabled('button.apply-features'), 'nothing touched again');
  await page.uncheck(`${training} .feature-toggle`);
  await page.uncheck(`${inference} .feature-toggle`);
  await page.uncheck(`${tiered} .feature-toggle`);
  await page.uncheck(`${scaling} .feature-toggle`);
  await page.uncheck(`${ray} .feature-toggle`);
  await page.click('button.apply-features');
  await page.waitForSelector('.features .plan li[data-kind="k8s:apiextensions.k8s.io/v1/CustomResourceDefinition"][data-action="delete"]');
  await page.waitForSelector('.features .plan li[data-kind="eks:Addon"][data-action="delete"]');
  await page.waitForSelector('.features .plan li[data-kind="k8s:karpenter.sh/v1/NodePool"][data-action="delete"]');
  await page.waitForSelector('.features .plan li[data-kind="k8s:v1/ServiceAccount"][data-action="delete"]');
  await page.waitForSelector('.features .plan li[data-kind="s3:Bucket"][data-action="delete"]');
  await page.click('button.apply-features');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/features', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`${training}[data-state="off"]`);
  await page.waitForSelector(`${inference}[data-state="off"]`);
  await page.waitForSelector(`${tiered}[data-state="off"]`);
  await page.waitForSelector(`${scaling}[data-state="off"]`);
  await page.waitForSelector(`${ray}[data-state="off"]`);
  await page.waitForSelector(`${keda}[data-state="off"]`);
  await page.waitForSelector('.features tr[data-component="cert-manager"] td:text("ACTIVE")');
  await page.waitForSelector('.features tr[data-component="aws-fsx-csi-driver"] td:text("absent")');
  // KEDA alone (the inference operator, whose add-on brings its own, is off now): its
  // release's APIService in the plan, on, then off after its plan.
  await settled(page);
  await page.check(`${keda} .feature-toggle`);
  await page.click('button.apply-features');
  await page.waitForSelector('.features .plan li[data-kind="k8s:apiregistration.k8s.io/v1/APIService"][data-action="create"]');
  await page.click('button.apply-features');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/features', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`${keda}[data-state="on"] .feature-details li:text("Deployment keda/keda-operator available")`);
  await settled(page);
  await page.uncheck(`${keda} .feature-toggle`);
  await page.click('button.apply-features');
  await page.waitForSelector('.features .plan li[data-kind="k8s:v1/Namespace"][data-action="delete"]');
  await page.click('button.apply-features');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/features', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`${keda}[data-state="off"]`);

  // The groups change from the page, each plan first: the spot group scaled, a group
  // added, then deleted (its plan comes with the confirmation).
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  const spot = '.group-actions[data-group="spot-1"]';
  await page.waitForSelector(spot);
  await settled(page);
  await page.fill(`${spot} .group-count`, '2');
  await page.click(`${spot} button.scale-group`);
  await page.waitForSelector(`${spot} .plan li[data-kind="sagemaker:Cluster"][data-action="update"]`);
  assert.equal(await page.textContent(`${spot} button.scale-group`), 'Apply');
  await shot(page, 'group-scale-plan');
  await page.click(`${spot} button.scale-group`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  await page.waitForSelector('.instance-groups tr[data-group="spot-1"] td.count:text("/ 2")');
  await settled(page);

  // A bad value is refused beside the form, by the request type's own rules.
  await page.fill('#add-group-name', 'Bad_Name');
  await page.click('form.add-group button[type="submit"]');
  await page.waitForSelector('form.add-group [role="alert"]');
  assert.match(await page.textContent('form.add-group [role="alert"]'), /group\.name/);
  // The extra group runs on a training plan the account bought (two g6e in us-east-1a).
  const sagemaker = async (target, body) => {
    const res = await fetch(server.world.simUrl, {
      method: 'POST',
      headers: { 'x-amz-target': `SageMaker.${target}`, 'content-type': 'application/x-amz-json-1.1' },
      body: JSON.stringify(body),
    });
    return res.json();
  };
  const bought = await sagemaker('CreateTrainingPlan', { TrainingPlanName: 'e2e-run', TrainingPlanOfferingId: 'tpo-g6e-2-use1a' });
  for (let i = 0; i < 100; i++) {
    if ((await sagemaker('DescribeTrainingPlan', { TrainingPlanName: 'e2e-run' })).Status === 'Active') break;
    await page.waitForTimeout(100);
  }
  await page.fill('#add-group-name', 'extra');
  await page.fill('#add-group-type', 'ml.g6e.48xlarge');
  await page.fill('#add-group-count', '2');
  await page.selectOption('#add-group-capacity', 'training_plan');
  await page.fill('#add-group-plan', bought.TrainingPlanArn);
  await page.fill('#add-group-zone', 'us-east-1a');
  await page.click('form.add-group button[type="submit"]');
  await page.waitForSelector('form.add-group .plan li[data-kind="sagemaker:Cluster"][data-action="update"]');
  assert.equal(await page.textContent('form.add-group button[type="submit"]'), 'Add group');
  await shot(page, 'group-add-plan');
  await page.click('form.add-group button[type="submit"]');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  const extra = '.group-actions[data-group="extra"]';
  await page.waitForSelector(extra);
  assert.match(await page.textContent('.instance-groups tr[data-group="extra"] td.arn'), /training-plan\/e2e-run/);
  await settled(page);
  await page.click(`${extra} button.delete-group`);
  await page.waitForSelector(`${extra} .plan li[data-kind="sagemaker:Cluster"]`);
  assert.equal(await page.textContent(`${extra} button.delete-group`), 'Delete group');
  await shot(page, 'group-delete-plan');
  await page.click(`${extra} button.delete-group`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  await page.waitForSelector('.instance-groups tr[data-group="spot-1"]');
  assert.equal(await page.locator('.instance-groups tr[data-group="extra"]').count(), 0);

  // Nodes: filtered by health and group, a spot node rebooted after its plan, another
  // replaced after its plan and confirmation (the plan says its volumes are wiped).
  await settled(page);
  await page.selectOption('.node-health-filter', 'healthy');
  await page.waitForSelector('.node-page-counts[data-total="4"]');
  await page.selectOption('.node-group-filter', 'spot-1');
  await page.waitForSelector('.node-page-counts[data-total="2"]');
  assert.equal(await page.locator('table.nodes tbody tr').count(), 2);
  assert.equal(await page.locator('table.nodes td.health-label .badge:text-is("Schedulable")').count(), 2);
  const spotNodes = await page.locator('table.nodes tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-node')));
  await page.click('th button.sort:text("Node")');
  await page.click('th button.sort:text("Node")');
  const descending = await page.locator('table.nodes tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-node')));
  assert.deepEqual(descending, [...spotNodes].sort().reverse());
  await page.check(`tr[data-node="${spotNodes[0]}"] input.select-node`);
  await page.click('button.reboot-nodes');
  await page.waitForSelector(`.node-actions .plan li[data-kind="sagemaker:ClusterNode"][data-action="update"]`);
  assert.equal(await page.textContent('button.reboot-nodes'), 'Reboot 1 node');
  await shot(page, 'nodes-reboot-plan');
  await page.click('button.reboot-nodes');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`tr[data-node="${spotNodes[1]}"] input.select-node`);
  await settled(page);
  await page.check(`tr[data-node="${spotNodes[1]}"] input.select-node`);
  await page.click('button.replace-nodes');
  await page.waitForSelector('.node-actions .plan li[data-kind="sagemaker:ClusterNode"]');
  assert.match(await page.textContent('.node-actions .plan'), /wiped/);
  assert.equal(await page.textContent('button.replace-nodes'), 'Replace 1 node');
  await shot(page, 'nodes-replace-plan');
  await page.click('button.replace-nodes');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  await page.waitForSelector('.node-page-counts[data-healthy="4"]');
  assert.equal(await page.locator(`tr[data-node="${spotNodes[1]}"]`).count(), 0);
  await shot(page, 'nodes-after-replace');
  // The platform image, moved to a pinned release half the nodes at a time.
  await settled(page);
  // A bad value is refused in the page by the request's own type, with REST's words.
  await page.fill('input.software-batch', '0');
  await page.click('button.update-software');
  await page.waitForSelector('.software-update [role="alert"][data-error="validation"]');
  const [badStatus, bad] = await rest(server, admin, 'POST', '/api/v1/clusters/e2e-ml/software-update', { batch_percent: 0 });
  assert.equal(badStatus, 422, JSON.stringify(bad));
  const [{ field, message }] = bad.error.errors;
  assert.equal(field, 'batch_percent');
  const refused = await page.textContent('.software-update [role="alert"]');
  assert.ok(refused.includes(field) && refused.includes(message), `${refused} | ${field}: ${message}`);
  await page.fill('input.software-release', '2025.09.15');
  await page.fill('input.software-batch', '50');
  await page.click('button.update-software');
  await page.waitForSelector('.software-update .plan li[data-kind="sagemaker:Cluster"][data-action="update"]');
  assert.match(await page.textContent('.software-update .plan'), /2025\.09\.15/);
  assert.equal(await page.textContent('button.update-software'), 'Start the update');
  await shot(page, 'software-update-plan');
  await page.click('button.update-software');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await hydrated(page);
  await page.waitForSelector('table.nodes tbody tr');
  assert.equal(await page.locator('table.nodes .image-release:text("2025.09.15")').count(), 4);

  // The health label flow: HyperPod's agent finds a fault on a node and marks it for
  // replacement; the table shows the label and the node unhealthy; HyperPod (node
  // recovery Automatic) replaces it, and the new node is Schedulable. The clock runs at
  // AWS's pace while the mark is looked at.
  const clock = (time_scale) =>
    fetch(new URL('/_sim/clock', server.world.simUrl), {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ time_scale }),
    });
  const sick = await page.getAttribute('table.nodes tbody tr', 'data-node');
  assert.equal((await clock(1)).status, 200);
  const fault = await fetch(new URL(`/_sim/sagemaker/clusters/e2e-ml/nodes/${sick}/fault`, server.world.simUrl), {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ recovery: 'replace' }),
  });
  assert.equal(fault.status, 200, await fault.text());
  await settled(page);
  // Both facts from one answer: Refresh reads HyperPod again, and the label reaches the
  // node view through its watch, moments after the fault (so Refresh until both show).
  const marked = `tr[data-node="${sick}"][data-health="unhealthy"] td.health-label .badge:text-is("UnschedulablePendingReplacement")`;
  for (let i = 0; i < 20 && (await page.locator(marked).count()) === 0; i++) {
    await page.click('button:text("Refresh")');
    await page.waitForTimeout(250);
  }
  await page.waitForSelector(marked);
  await shot(page, 'nodes-health-label');
  // The sick node's diagnosis: the agent's fault with its message first, and, as
  // HyperPod replaces it on its own, only the read that follows it is suggested.
  await page.click(`tr[data-node="${sick}"] button.diagnose-node`);
  await page.waitForSelector(`.node-diagnosis[data-node="${sick}"] .diagnosis`);
  const first = page.locator('.node-diagnosis .finding').first();
  assert.equal(await first.getAttribute('data-severity'), 'error');
  assert.match(await first.textContent(), /NvidiaErrorTerminate \(XidHardwareFailure\).*fallen off the bus/);
  assert.deepEqual(
    await page.locator('.node-diagnosis .suggestion').evaluateAll((l) => l.map((e) => e.dataset.command)),
    ['list_nodes'],
  );
  await shot(page, 'nodes-diagnosis');
  assert.equal((await clock(600)).status, 200);
  for (let i = 0; i < 60; i++) {
    const gone = (await page.locator(`tr[data-node="${sick}"]`).count()) === 0;
    if (gone && (await page.getAttribute('.node-page-counts', 'data-healthy')) === '4') break;
    await page.waitForTimeout(500);
    await page.click('button:text("Refresh")');
  }
  assert.equal(await page.locator(`tr[data-node="${sick}"]`).count(), 0);
  await page.waitForSelector('.node-page-counts[data-healthy="4"]');
  assert.equal(await page.locator('table.nodes td.health-label .badge:text-is("Schedulable")').count(), 4);

  // Its name is taken now: the server says so beside the name field.
  await fillForm(page, 'e2e-ml');
  await page.click('button[type="submit"]');
  await page.waitForSelector('#name-error p:text("already manages a cluster named e2e-ml")');
  assert.equal(await page.getAttribute('#name', 'aria-invalid'), 'true');
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot(page, 'create-form-dark');
  await page.emulateMedia({ colorScheme: 'light' });
  await fitsWidth(page, 1024);

  await page.goto(new URL('/clusters', server.url).href);
  await page.waitForSelector('tr[data-cluster="e2e-ml"] .state-active');
  // Node health as last observed, shown in the list without an AWS call per row: two
  // accelerated nodes and the spot group scaled to two.
  const counts = page.locator('tr[data-cluster="e2e-ml"] .node-counts');
  assert.equal(await counts.getAttribute('data-total'), '4');
  assert.equal(await counts.getAttribute('data-healthy'), '4');
  await shot(page, 'clusters-created');
  assert.deepEqual(errors, []);
});

test('an operator mounts a second bucket, uploads a file into it, finds it where pods see it, and unmounts it', async () => {
  const { page, errors } = await newPage();
  await signIn(page, admin, '/clusters/e2e-ml/storage');
  // The shared bucket, browsed at /s3 until another storage is chosen.
  await page.waitForSelector('.storage-table tr[data-storage="shared-s3"] .state-bound');
  await page.waitForSelector('.storage-browser[data-storage="shared-s3"] .in-pods:text-is("/s3")');
  await settled(page);
  // Mount a bucket: the plan first (a new bucket, its volume and claim), then the run.
  await page.fill('form.add-storage input[name="storage"]', 'data');
  await page.click('form.add-storage button[type="submit"]');
  await page.waitForSelector('form.add-storage .plan li[data-kind="s3:Bucket"][data-action="create"]');
  await page.waitForSelector('form.add-storage .plan li[data-kind="k8s:v1/PersistentVolumeClaim"][data-action="create"]');
  await page.click('form.add-storage button[type="submit"]');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/storage', server.url).href);
  await hydrated(page);
  const row = '.storage-table tr[data-storage="data"]';
  await page.waitForSelector(`${row} .state-bound`);
  assert.match(await page.textContent(row), /\/mnt\/data/);
  await settled(page);
  // Nothing keeps pods from mounting either storage.
  await page.click('button.check-storage');
  await page.waitForSelector('.check-result.ok:text("Every storage can be mounted")');
  // Browse it and upload a script into a folder of its own.
  await page.click(`${row} button.browse-storage`);
  await page.waitForSelector('.storage-browser[data-storage="data"] .in-pods:text-is("/mnt/data")');
  await page.setInputFiles('form.upload input[type="file"]', {
    name: 'train.py',
    mimeType: 'text/x-python',
    buffer: Buffer.from("print('hello from the console')\n"),
  });
  await page.fill('form.upload input[name="key"]', 'scripts/train.py');
  await page.click('form.upload button[type="submit"]');
  await page.waitForSelector('form.upload .plan li[data-kind="s3:Object"][data-action="create"]');
  await page.click('form.upload button[type="submit"]');
  await page.waitForSelector('form.upload .done:text("/mnt/data/scripts/train.py")');
  await page.click('.storage-browser button.folder[data-folder="scripts/"]');
  await page.waitForSelector('.storage-browser tr[data-key="scripts/train.py"]');
  assert.match(await page.textContent('.storage-browser tr[data-key="scripts/train.py"]'), /32 B.*\/mnt\/data\/scripts\/train\.py/);
  await shot(page, 'storage-browser');
  // REST lists the same file at the same path.
  const [status, listed] = await rest(server, admin, 'GET', '/api/v1/clusters/e2e-ml/storage/data/contents?prefix=scripts/');
  assert.equal(status, 200, JSON.stringify(listed));
  assert.deepEqual(listed.files.map((f) => [f.key, f.size_bytes, f.path_in_pods]), [['scripts/train.py', 32, '/mnt/data/scripts/train.py']]);
  // Unmount: the plan and its confirmation, then the run; the bucket holds the script,
  // so it is kept.
  await page.click(`${row} button.delete-storage`);
  await page.waitForSelector(`${row} .plan li[data-kind="k8s:v1/PersistentVolumeClaim"][data-action="delete"]`);
  await page.click(`${row} button.delete-storage`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  const [s2, left] = await rest(server, admin, 'GET', '/api/v1/clusters/e2e-ml/storage');
  assert.equal(s2, 200, JSON.stringify(left));
  assert.deepEqual(left.storage.map((x) => x.name), ['shared-s3']);
  assert.deepEqual(errors, []);
});

test('an operator creates a Lustre file system linked to the shared bucket, sees it mounted, and deletes it', async () => {
  const { page, errors } = await newPage();
  await signIn(page, admin, '/clusters/e2e-ml/storage');
  await page.waitForSelector('.storage-table tr[data-storage="shared-s3"] .state-bound');
  await settled(page);
  const form = 'form.add-file-system';
  // A size FSx does not take: refused by field before anything is planned.
  await page.fill(`${form} input[name="storage"]`, 'scratch');
  await page.fill(`${form} input[name="capacity_gib"]`, '1000');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .form-alert[data-error="validation"]:text("capacity_gib")`);
  // Then the plan (the driver, the file system, its link, the volume) and the run.
  await page.fill(`${form} input[name="capacity_gib"]`, '1200');
  await page.fill(`${form} input[name="data_repositories[0].file_system_path"]`, '/shared');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="fsx:FileSystem"][data-action="create"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="fsx:DataRepositoryAssociation"][data-action="create"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 180_000 });
  await page.goto(new URL('/clusters/e2e-ml/storage', server.url).href);
  await hydrated(page);
  const row = '.storage-table tr[data-storage="scratch"]';
  await page.waitForSelector(`${row} .state-bound`);
  assert.match(await page.textContent(row), /fsx.*fs-[0-9a-f]{17}.*\/mnt\/scratch/);
  // REST says the same; nothing keeps pods from mounting it.
  const [status, listed] = await rest(server, admin, 'GET', '/api/v1/clusters/e2e-ml/storage');
  assert.equal(status, 200, JSON.stringify(listed));
  const fsx = listed.storage.find((x) => x.name === 'scratch');
  assert.equal(fsx.kind, 'fsx');
  assert.match(fsx.file_system, /^fs-/);
  await settled(page);
  await page.click('button.check-storage');
  await page.waitForSelector('.check-result.ok:text("Every storage can be mounted")');
  await shot(page, 'storage-fsx');
  // Delete it: the plan names the file system, then the confirmation runs it.
  await page.click(`${row} button.delete-storage`);
  await page.waitForSelector(`${row} .plan li[data-kind="fsx:FileSystem"][data-action="delete"]`);
  await page.click(`${row} button.delete-storage`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 180_000 });
  const [s2, left] = await rest(server, admin, 'GET', '/api/v1/clusters/e2e-ml/storage');
  assert.equal(s2, 200, JSON.stringify(left));
  assert.deepEqual(left.storage.map((x) => x.name), ['shared-s3']);
  assert.deepEqual(errors, []);
});

test('an operator downloads a model into the shared bucket and finds it listed with its commit', async () => {
  const { page, errors } = await newPage();
  await signIn(page, admin, '/clusters/e2e-ml/models');
  await page.waitForSelector('.models .empty-models');
  await settled(page);
  const token = 'hf_consoleSecret0123456789abcdef';
  await page.fill('form.download-model input[name="model"]', 'Qwen/Qwen2.5-0.5B');
  await page.fill('form.download-model input[name="hf_token"]', token);
  await page.click('form.download-model button[type="submit"]');
  // The plan: the token's Secret and the Job.
  await page.waitForSelector('form.download-model .plan li[data-kind="k8s:v1/Secret"][data-action="create"]');
  await page.waitForSelector('form.download-model .plan li[data-kind="k8s:batch/v1/Job"][data-action="create"]');
  await page.click('form.download-model button[type="submit"]');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/models', server.url).href);
  await hydrated(page);
  const row = '.model-table tr[data-model="Qwen/Qwen2.5-0.5B"]';
  await page.waitForSelector(`${row} .state-complete`);
  assert.match(await page.textContent(row), /\/s3\/models\/Qwen\/Qwen2\.5-0\.5B/);
  await shot(page, 'models');
  const [status, ops] = await rest(server, admin, 'GET', '/api/v1/operations');
  assert.equal(status, 200);
  assert.ok(!JSON.stringify(ops).includes(token), 'the token is in no answer');
  assert.deepEqual(errors, []);
});

test('an operator makes the MLflow server, checks a PyTorch job, reviews its plan, runs it, sees its budget, logs and loss chart, and runs a VERL job', async () => {
  // The operator on and a script in the bucket, through REST: their own forms are tested above.
  const [s1, on] = await rest(server, admin, 'POST', '/api/v1/clusters/e2e-ml/features', { training_operator: true });
  assert.equal(s1, 200, JSON.stringify(on));
  const done = await waitForOperation(server, admin, on.operation_id, (op) => ['succeeded', 'failed'].includes(op.state));
  assert.equal(done.state, 'succeeded', JSON.stringify(done));
  const { page, errors } = await newPage();
  await signIn(page, admin, '/clusters/e2e-ml/training');
  await page.waitForSelector('.training .empty-training');
  await settled(page);
  // No MLflow tracking server yet: the tab offers to make one, plan first.
  await page.selectOption('form.create-mlflow select[name="size"]', 'Small');
  await page.click('form.create-mlflow button[type="submit"]');
  await page.waitForSelector('form.create-mlflow .plan li[data-kind="sagemaker:MlflowTrackingServer"][data-action="create"]');
  await page.click('form.create-mlflow button[type="submit"]');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/training', server.url).href);
  await hydrated(page);
  await page.waitForSelector('.mlflow-server .state-created');
  await settled(page);
  const form = 'form.submit-training';
  await page.fill(`${form} input[name="job"]`, 'console-train');
  await page.fill(`${form} input[name="recipe.file"]`, '/s3/scripts/console-train.py');
  await page.fill(`${form} input[name="recipe.args"]`, '--epochs 2');
  // The cluster has two GPU groups: the job names the on-demand one.
  await page.fill(`${form} input[name="instance_group"]`, 'accelerated-1');
  // The script is not uploaded yet: the check says so, by name, and the others pass.
  await page.click(`${form} button.check-training`);
  await page.waitForSelector(`${form} .verdicts li[data-check="file"][data-passed="false"]`);
  await page.waitForSelector(`${form} .verdicts li[data-check="feature"][data-passed="true"]`);
  const script = Buffer.from("print('step 1 loss=2.5')\n").toString('base64');
  const [s2, put] = await rest(server, admin, 'POST', '/api/v1/clusters/e2e-ml/storage/shared-s3/files',
    { key: 'scripts/console-train.py', content_base64: script });
  assert.equal(s2, 200, JSON.stringify(put));
  await page.click(`${form} button.check-training`);
  await page.waitForSelector(`${form} .verdicts.ready li[data-check="file"][data-passed="true"]`);
  // The plan: the job itself, then the run.
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:sagemaker.amazonaws.com/v1/HyperPodPyTorchJob"][data-action="create"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/training', server.url).href);
  await hydrated(page);
  const row = '.job-table tr[data-job="console-train"]';
  await page.waitForSelector(`${row} .state-running`);
  await page.click(`${row} button.show-job`);
  await page.waitForSelector('.job-detail .pod-table tr[data-pod] .state-running');
  assert.equal(await page.textContent('.job-detail .restarts-left'), '50');
  assert.match(await page.textContent('.job-detail .next-failure'), /the failed pod restarts \(restart 1 of 50\)/);
  // Its diagnosis, on demand: running quietly, nothing to suggest.
  await page.click('.job-detail button.diagnose-job');
  await page.waitForSelector('.job-detail .diagnosis[data-subject="training_job/e2e-ml/console-train"]');
  assert.equal(await page.textContent('.job-detail .diagnosis .finding'), 'the job is running, 1 pod');
  assert.equal(await page.locator('.job-detail .diagnosis .suggestion').count(), 0);
  // The pod's log, live: lines arrive, a search shows the matching ones only, pause holds the view.
  await page.waitForFunction(() => Number(document.querySelector('.job-detail pre.log')?.dataset.lines || 0) >= 5);
  assert.match(await page.textContent('.job-detail pre.log'), /console-train-pod-0 step \d+: loss=/);
  const shownLog = (await page.textContent('.job-detail pre.log')).trim().split('\n');
  const needle = `step ${shownLog[shownLog.length - 1].match(/step (\d+):/)[1]}:`;
  await page.fill('.job-detail input[name="log-search"]', needle);
  await page.waitForFunction((n) => {
    const t = document.querySelector('.job-detail pre.log').textContent;
    return t.length > 0 && t.split('\n').every((l) => l.includes(n));
  }, needle);
  await page.fill('.job-detail input[name="log-search"]', '');
  await page.click('.job-detail button.log-pause');
  const held = await page.getAttribute('.job-detail pre.log', 'data-lines');
  await page.waitForTimeout(500);
  assert.equal(await page.getAttribute('.job-detail pre.log', 'data-lines'), held);
  await page.click('.job-detail button.log-pause');
  assert.match(await page.getAttribute('.job-detail a.log-download', 'href'), /^data:text\/plain/);
  // The job reports to the cluster's MLflow server: its run, and its loss charted from
  // the points the pod posted to the real MLflow server.
  await page.waitForSelector('.job-detail .run-table tr[data-run]', { timeout: 60_000 }).catch(async () => {
    await page.click('.job-detail button.refresh-job');
    await page.waitForSelector('.job-detail .run-table tr[data-run]', { timeout: 60_000 });
  });
  const charted = async () => {
    const points = await page.getAttribute('.job-detail figure.chart[data-metric="loss"] polyline', 'points').catch(() => null);
    return points ? points.trim().split(' ').length : 0;
  };
  for (let i = 0; i < 60 && (await charted()) < 3; i++) {
    await page.click('.job-detail button.refresh-metrics');
    await page.waitForTimeout(500);
  }
  assert.ok((await charted()) >= 3, 'the loss chart has points');
  await page.waitForSelector('.job-detail figure.chart[data-metric="system/gpu_0_utilization_percentage"] polyline');
  await shot(page, 'training');
  // REST reads the same job.
  const [s3, got] = await rest(server, admin, 'GET', '/api/v1/clusters/e2e-ml/training-jobs/console-train');
  assert.equal(s3, 200, JSON.stringify(got));
  assert.deepEqual([got.recipe, got.phase, got.recovery.restarts_left], ['pytorch', 'running', 50]);
  assert.equal(got.mlflow.runs[0].attempt, 1);

  // A VERL job through the same form: KubeRay on (through REST), then a RayJob planned and run.
  const [s4, ray] = await rest(server, admin, 'POST', '/api/v1/clusters/e2e-ml/features', { kuberay_operator: true });
  assert.equal(s4, 200, JSON.stringify(ray));
  const rayDone = await waitForOperation(server, admin, ray.operation_id, (op) => ['succeeded', 'failed'].includes(op.state));
  assert.equal(rayDone.state, 'succeeded', JSON.stringify(rayDone));
  await page.goto(new URL('/clusters/e2e-ml/training', server.url).href);
  await hydrated(page);
  await settled(page);
  await page.fill(`${form} input[name="job"]`, 'console-rl');
  await page.selectOption(`${form} select[name="recipe.kind"]`, 'verl');
  await page.fill(`${form} input[name="recipe.file"]`, '');
  await page.fill(`${form} input[name="recipe.args"]`, 'data.train_files=/s3/data/train.parquet');
  await page.fill(`${form} input[name="instance_group"]`, 'accelerated-1');
  await page.click(`${form} button.check-training`);
  await page.waitForSelector(`${form} .verdicts.ready li[data-check="feature"][data-passed="true"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:ray.io/v1/RayJob"][data-action="create"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/training', server.url).href);
  await hydrated(page);
  const rl = '.job-table tr[data-job="console-rl"]';
  await page.waitForSelector(`${rl} .state-running`);
  assert.match(await page.textContent(rl), /verl/);
  assert.deepEqual(errors, []);
});

test('an operator is refused the inference operator\'s path where it cannot run, deploys a vLLM model server from the Inference tab, reviews its plan, sends it a message, and deletes it, then binds a model pool\'s worker to an adapter, then puts SGLang behind its router with KEDA', async () => {
  const { page, errors } = await newPage();
  await signIn(page, admin, '/clusters/e2e-ml/inference');
  await page.waitForSelector('.endpoints .empty-endpoints');
  await settled(page);
  const form = 'form.deploy-model-server';
  // The inference operator's path: its options are vLLM's only, refused by field before
  // any call; a cluster without the operator (turned off above) is told to turn it on.
  await page.selectOption(`${form} select[name="path"]`, 'operator');
  await page.fill(`${form} input[name="endpoint"]`, 'console-kv');
  await page.selectOption(`${form} select[name="engine"]`, 'sglang');
  await page.fill(`${form} input[name="command"]`, 'python3 -m sglang.launch_server --model-path /s3/models/Qwen/Qwen2.5-0.5B');
  await page.selectOption(`${form} select[name="routing"]`, 'kv_aware');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} [role="alert"]`);
  assert.match(await page.textContent(form), /intelligent routing works with vLLM workers only/);
  await page.selectOption(`${form} select[name="engine"]`, 'vllm');
  await page.fill(`${form} input[name="command"]`, 'vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForFunction((f) => /does not run the HyperPod inference operator/.test(document.querySelector(f).textContent), form);
  // The JumpStart catalogue, its form's code and the catalogue itself fetched when asked
  // for: a gated model with its licence and the
  // groups of a type it runs on; choosing it fills the form, which the server refuses
  // here for the operator's absence, by its words.
  const catalogue = 'form.deploy-jumpstart';
  await page.click('button.open-catalogue');
  await page.fill(`${catalogue} input[name="search"]`, 'llama-3-1');
  await page.click(`${catalogue} button.browse-catalogue`);
  const llama = `${catalogue} tr:has(button:text("meta-textgeneration-llama-3-1-8b-instruct"))`;
  await page.waitForSelector(llama);
  assert.match(await page.textContent(llama), /gated \(s3:\/\/.*llama3_1Eula\.txt\)/);
  assert.match(await page.textContent(llama), /ml\.g5\.8xlarge/);
  await page.click(`${llama} button`);
  assert.equal(await page.inputValue(`${catalogue} input[name="model_id"]`), 'meta-textgeneration-llama-3-1-8b-instruct');
  await page.fill(`${catalogue} input[name="endpoint"]`, 'console-llama');
  await page.check(`${catalogue} input[name="accept_eula"]`);
  // The operator's options, offered as on the operator's path, go with the request.
  await page.selectOption(`${catalogue} select[name="kv_cache"]`, 'cpu');
  await page.selectOption(`${catalogue} select[name="routing"]`, 'prefix_aware');
  // The console's one server function carries the command's own JSON.
  const sent = page.waitForRequest((r) => r.method() === 'POST' && r.url().endsWith('/fn/run_command')
    && JSON.parse(r.postData()).command === 'deploy_jumpstart_model');
  await page.click(`${catalogue} button[type="submit"]`);
  const { input } = JSON.parse((await sent).postData());
  assert.deepEqual([input.model_id, input.routing, input.kv_cache],
    ['meta-textgeneration-llama-3-1-8b-instruct', 'prefix_aware', { cpu_offload: true }]);
  await page.waitForFunction((f) => /JumpStartModel is not served/.test(document.querySelector(f).textContent), catalogue);
  await page.selectOption(`${form} select[name="path"]`, 'model_server');
  await page.fill(`${form} input[name="endpoint"]`, 'console-chat');
  // The training jobs hold accelerated-1's GPUs: the server goes on the spot group.
  await page.fill(`${form} input[name="instance_group"]`, 'spot-1');
  // A line vLLM would not run: refused with the contract's words before any call.
  await page.fill(`${form} input[name="command"]`, 'python3 serve.py');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} [role="alert"]`);
  assert.match(await page.textContent(`${form} [role="alert"]`), /vllm serve <model>/);
  // The model the Models tab downloaded; the plan, then the run.
  await page.fill(`${form} input[name="command"]`, 'vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:apps/v1/Deployment"][data-action="create"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:v1/Service"][data-action="create"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/inference', server.url).href);
  await hydrated(page);
  const row = '.endpoint-table tr[data-endpoint="console-chat"]';
  await page.waitForSelector(`${row} .state-in_service`);
  assert.equal((await page.textContent(`${row} td.replicas`)).trim(), '1 / 1');
  await settled(page);
  // The test panel: the model's answer, through the cluster's API server.
  await page.fill('form.try-endpoint input[name="endpoint"]', 'console-chat');
  await page.fill('form.try-endpoint textarea[name="prompt"]', 'What does HyperPod recover from?');
  await page.click('form.try-endpoint button[type="submit"]');
  await page.waitForSelector('form.try-endpoint .invocation .answer');
  assert.ok((await page.textContent('form.try-endpoint .invocation .answer')).trim().length > 0);
  assert.match(await page.textContent('form.try-endpoint .invocation .muted'), /^qwen · \d+ prompt \+ \d+ completion tokens · \d+ ms$/);
  await shot(page, 'inference');
  // Every cluster's endpoints, one page away, each linking back to its cluster's tab.
  await page.click('nav a:text-is("Endpoints")');
  await page.waitForSelector('.endpoint-table tr[data-endpoint="console-chat"] a[href="/clusters/e2e-ml/inference"]');
  await page.click('.endpoint-table tr[data-endpoint="console-chat"] a');
  await page.waitForSelector('form.scale-endpoint');
  await settled(page);
  // Deleted in two steps: its plan, then the run.
  await page.fill('form.scale-endpoint input[name="endpoint"]', 'console-chat');
  await page.click('form.scale-endpoint button.delete-endpoint');
  await page.waitForSelector('form.scale-endpoint .plan li[data-kind="k8s:apps/v1/Deployment"][data-action="delete"]');
  assert.equal(await page.textContent('form.scale-endpoint button.delete-endpoint'), 'Delete');
  await page.click('form.scale-endpoint button.delete-endpoint');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  // A model pool: one warm worker, bound to a LoRA adapter from the pool form (its
  // plan is the worker's label), shown bound in the table, then deleted.
  await page.goto(new URL('/clusters/e2e-ml/inference', server.url).href);
  await hydrated(page);
  await settled(page);
  await page.fill(`${form} input[name="endpoint"]`, 'console-pool');
  await page.fill(`${form} input[name="instance_group"]`, 'spot-1');
  await page.fill(`${form} input[name="command"]`, 'vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name base --enable-lora --lora-modules sql=/s3/models/Qwen/Qwen2.5-0.5B/sql');
  await page.selectOption(`${form} select[name="service"]`, 'model_pool');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:apps/v1/Deployment"][data-action="create"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/inference', server.url).href);
  await hydrated(page);
  const pooled = '.endpoint-table tr[data-endpoint="console-pool"]';
  await page.waitForSelector(`${pooled} .state-in_service`);
  await settled(page);
  const pool = 'form.pool-workers';
  await page.fill(`${pool} input[name="pool"]`, 'console-pool');
  await page.fill(`${pool} input[name="model"]`, 'sql');
  await page.click(`${pool} button[type="submit"]`);
  await page.waitForSelector(`${pool} .plan li[data-kind="k8s:v1/Pod"][data-action="update"]`);
  await page.click(`${pool} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/inference', server.url).href);
  await hydrated(page);
  await page.waitForSelector(`${pooled} .state-in_service`);
  assert.match(await page.textContent(pooled), /pool · base 0, sql 1 · free 0/);
  await settled(page);
  // Its pod, bound to the adapter, never restarted.
  await page.fill('form.endpoint-details input[name="endpoint"]', 'console-pool');
  await page.click('form.endpoint-details button[type="submit"]');
  await page.waitForSelector('form.endpoint-details .pod-table tbody tr');
  const worker = await page.textContent('form.endpoint-details .pod-table tbody tr');
  assert.match(worker, /ready/);
  assert.equal((await page.textContent('form.endpoint-details .pod-table tbody tr td.serves')).trim(), 'sql');
  await page.fill('form.scale-endpoint input[name="endpoint"]', 'console-pool');
  await page.click('form.scale-endpoint button.delete-endpoint');
  await page.waitForSelector('form.scale-endpoint .plan li[data-kind="k8s:v1/Service"][data-action="delete"]');
  await page.click('form.scale-endpoint button.delete-endpoint');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  // SGLang behind its router, sized by KEDA down to zero: refused while the cluster runs
  // no KEDA (the conflict names the feature); with KEDA on, the plan lists the router's
  // account, the Prometheus server the request rate is read from and the ScaledObject,
  // the table the policy and bounds; idle, it goes to zero;
  // the test panel's message is held by the router while KEDA wakes a worker, and
  // answered; the detail's chart shows KEDA's steps.
  await page.goto(new URL('/clusters/e2e-ml/inference', server.url).href);
  await hydrated(page);
  await settled(page);
  await page.fill(`${form} input[name="endpoint"]`, 'console-sg');
  await page.fill(`${form} input[name="instance_group"]`, 'spot-1');
  await page.selectOption(`${form} select[name="engine"]`, 'sglang');
  await page.fill(`${form} input[name="command"]`, 'python3 -m sglang.launch_server --model-path /s3/models/Qwen/Qwen2.5-0.5B --served-model-name sg');
  await page.selectOption(`${form} select[name="router.policy"]`, 'round_robin');
  await page.fill(`${form} input[name="autoscaling.min_replicas"]`, '0');
  await page.fill(`${form} input[name="autoscaling.max_replicas"]`, '1');
  await page.fill(`${form} input[name="autoscaling.request_rate.target_per_replica"]`, '2.5');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForFunction((f) => /does not run KEDA/.test(document.querySelector(f).textContent), form);
  const [kedaStatus, keda] = await rest(server, admin, 'POST', '/api/v1/clusters/e2e-ml/features', { keda: true });
  assert.equal(kedaStatus, 200, JSON.stringify(keda));
  await waitForOperation(server, admin, keda.operation_id, (op) => op.state === 'succeeded');
  await page.click(`${form} button[type="submit"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:keda.sh/v1alpha1/ScaledObject"][data-action="create"]`);
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:v1/ServiceAccount"][data-action="create"]`);
  // The request rate is asked of a Prometheus server beside the router.
  await page.waitForSelector(`${form} .plan li[data-kind="k8s:v1/ConfigMap"][data-action="create"]`);
  await page.click(`${form} button[type="submit"]`);
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  await page.goto(new URL('/clusters/e2e-ml/inference', server.url).href);
  await hydrated(page);
  const routed = '.endpoint-table tr[data-endpoint="console-sg"]';
  // Five idle minutes pass in half a second at this clock; the table, read again, shows it.
  await page.waitForSelector(routed);
  for (const until = Date.now() + 60_000; !(await page.locator(`${routed} .state-scaled_to_zero`).count());) {
    assert.ok(Date.now() < until, 'never scaled to zero');
    await page.click('button.refresh-endpoints');
    await page.waitForTimeout(250);
  }
  assert.match(await page.textContent(routed), /cluster_ip · router round_robin · KEDA 0–1/);
  await settled(page);
  const setClock = async (time_scale) => {
    const set = await fetch(new URL('/_sim/clock', server.world.simUrl), {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ time_scale }),
    });
    assert.equal(set.status, 200);
  };
  // Slower, so that the held message spans KEDA's looks in real time too; then at
  // AWS's pace while the woken worker is looked at, before its cooldown takes it again.
  await setClock(60);
  await page.fill('form.try-endpoint input[name="endpoint"]', 'console-sg');
  await page.fill('form.try-endpoint textarea[name="prompt"]', 'Wake up');
  await page.click('form.try-endpoint button[type="submit"]');
  await page.waitForSelector('form.try-endpoint .invocation .answer', { timeout: 60_000 });
  await setClock(1);
  assert.match(await page.textContent('form.try-endpoint .invocation .muted'), /^sg · /);
  await page.fill('form.endpoint-details input[name="endpoint"]', 'console-sg');
  await page.click('form.endpoint-details button[type="submit"]');
  await page.waitForSelector('form.endpoint-details .replica-chart figcaption');
  assert.match(await page.textContent('form.endpoint-details .options'), /KEDA 0–1 replicas at 4 requests in flight each or 2.5 requests a second each, cooldown 300 s/);
  assert.match(await page.textContent('form.endpoint-details .replica-chart figcaption'), /Replicas over time \(max 1\)\. \d+ changes: .*0 → 1; 1 now\./);
  assert.equal(await page.locator('form.endpoint-details .pod-table tbody tr').count(), 1, 'the router is no replica');
  await setClock(600);
  await page.fill('form.scale-endpoint input[name="endpoint"]', 'console-sg');
  await page.click('form.scale-endpoint button.delete-endpoint');
  await page.waitForSelector('form.scale-endpoint .plan li[data-kind="k8s:keda.sh/v1alpha1/ScaledObject"][data-action="delete"]');
  await page.click('form.scale-endpoint button.delete-endpoint');
  await page.waitForURL(/\/operations\/[^/]+$/);
  await page.waitForSelector('.progress[data-state="succeeded"]', { timeout: 120_000 });
  const [status, listed] = await rest(server, admin, 'GET', '/api/v1/endpoints?name=e2e-ml');
  assert.equal(status, 200, JSON.stringify(listed));
  assert.deepEqual(listed.endpoints, []);
  assert.deepEqual(errors, []);
});

test('a viewer is offered no create button, and the server refuses it anyway', async () => {
  const { page, errors } = await newPage();
  await signIn(page, viewer);
  await page.waitForSelector('.page-head h1:text("Clusters")');
  assert.equal(await page.locator('a:text("Create cluster")').count(), 0);
  await page.goto(new URL('/clusters/new', server.url).href);
  await page.waitForSelector('[data-error="forbidden"]');
  // The shell's refusal is the command's own role, in the server's words.
  assert.match(await page.textContent('[data-error="forbidden"]'), /create_cluster needs the operator role; token e2e-create-viewer has viewer/);
  assert.equal(await page.locator('form').count(), 0);
  await shot(page, 'create-viewer');
  // The cluster's groups are shown to a viewer, with nothing to change them.
  await page.goto(new URL('/clusters/e2e-ml/nodes', server.url).href);
  await page.waitForSelector('.instance-groups tr[data-group="spot-1"]');
  assert.equal(await page.locator('.group-actions').count(), 0);
  assert.equal(await page.locator('form.add-group').count(), 0);
  // Its nodes too, with nothing to select or act with.
  await page.waitForSelector('table.nodes tbody tr');
  assert.equal(await page.locator('.node-actions').count(), 0);
  assert.equal(await page.locator('input.select-node').count(), 0);
  // Its storage and files too, with nothing to mount, upload or delete.
  await page.goto(new URL('/clusters/e2e-ml/storage', server.url).href);
  await page.waitForSelector('.storage-table tr[data-storage="shared-s3"]');
  await page.waitForSelector('.storage-browser .where');
  assert.equal(await page.locator('form.add-storage, form.add-file-system, form.upload, button.delete-storage').count(), 0);

  const request = {
    name: 'e2e-viewer-ml',
    availability_zone: 'us-east-1a',
    instance_groups: [{ name: 'accelerated-1', instance_type: 'ml.g5.8xlarge', instance_count: 1 }],
  };
  const [status, body] = await rest(server, viewer, 'POST', '/api/v1/clusters', request);
  assert.equal(status, 403, JSON.stringify(body));
  assert.equal(body.error.kind, 'forbidden');
  // The console's own call path answers the same.
  const refused = await page.evaluate(async (input) => {
    const res = await fetch('/fn/run_command', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ command: 'create_cluster', input }),
    });
    return { status: res.status, body: await res.text() };
  }, request);
  assert.equal(refused.status, 403, refused.body);
  assert.equal(JSON.parse(refused.body).kind, 'forbidden');
  assert.deepEqual(errors, []);
});
