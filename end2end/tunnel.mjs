// A tunnel-like link to the console, for measurements: Chromium runs in a network
// namespace of its own and reaches hypd over a veth pair shaped to a rate by the kernel
// (tbf, both ways) and through a relay that delays every byte by half a round trip each
// way, as an SSM port-forwarding session carries a browser's connections. Needs root
// (`ip netns`, `tc`).
//
// The delay is the relay's, not netem's: this machine's kernel has no sch_netem (`tc
// qdisc add … netem` answers "Specified qdisc kind is unknown"), while tbf is there. A
// relay is also closer to SSM than netem would be: the browser's TCP handshake is with a
// local process (the session-manager plugin), and each new connection costs one round
// trip before its first byte moves (the plugin opens a stream to the agent, which
// connects to the target), then every byte one way half a round trip.
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });

// Opens the link: answers the host Chromium reaches hypd by (hypd must be told to answer
// to it: HYPD_ALLOWED_HOSTS), `forwardTo(target)` ("http://127.0.0.1:PORT", once hypd
// listens), which answers the base URL Chromium uses, the executable to launch Chromium
// with (inside the namespace), and `close()`.
export async function openTunnel({ rttMs, bytesPerSecond }) {
  if (process.getuid?.() !== 0) throw new Error('the tunnel needs root (ip netns, tc)');
  const tag = String(process.pid % 100000);
  const ns = `hypd-tunnel-${tag}`;
  const [outer, inner] = [`htun${tag}o`, `htun${tag}i`];
  // A /30 of its own per process, so two measurements cannot collide.
  const octet = (process.pid % 250) + 1;
  const [hostAddr, nsAddr] = [`10.231.${octet}.1`, `10.231.${octet}.2`];
  const dir = mkdtempSync(join(tmpdir(), 'hypd-tunnel-'));
  let server;
  const sockets = new Set();
  // Deleting the namespace deletes the veth end inside it, and with it the pair. Also
  // on exit: a measurement that dies half-way must not leave its namespace behind.
  const deleteNamespace = () => {
    try {
      ip('netns', 'del', ns);
    } catch {}
  };
  process.once('exit', deleteNamespace);
  const close = async () => {
    for (const s of sockets) s.destroy();
    if (server) await new Promise((r) => server.close(r));
    deleteNamespace();
    process.off('exit', deleteNamespace);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    ip('netns', 'add', ns);
    ip('link', 'add', outer, 'type', 'veth', 'peer', 'name', inner);
    ip('link', 'set', inner, 'netns', ns);
    ip('addr', 'add', `${hostAddr}/30`, 'dev', outer);
    ip('link', 'set', outer, 'up');
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    ip('-n', ns, 'addr', 'add', `${nsAddr}/30`, 'dev', inner);
    ip('-n', ns, 'link', 'set', inner, 'up');
    // Each end shapes what it sends: downloads on the host's end, uploads on the other.
    const rate = `${Math.round((bytesPerSecond * 8) / 1000)}kbit`;
    const tbf = ['root', 'tbf', 'rate', rate, 'burst', '32kb', 'latency', '5s'];
    execFileSync('tc', ['qdisc', 'add', 'dev', outer, ...tbf]);
    ip('netns', 'exec', ns, 'tc', 'qdisc', 'add', 'dev', inner, ...tbf);

    let upstream = null;
    const oneWay = rttMs / 2;
    server = net.createServer((client) => {
      sockets.add(client);
      const up = new net.Socket();
      sockets.add(up);
      const toServer = delayLine(up, oneWay);
      const toClient = delayLine(client, oneWay);
      client.on('data', (b) => toServer.push(b));
      up.on('data', (b) => toClient.push(b));
      client.on('end', () => toServer.end());
      up.on('end', () => toClient.end());
      const drop = () => {
        client.destroy();
        up.destroy();
        sockets.delete(client);
        sockets.delete(up);
      };
      client.on('error', drop);
      up.on('error', drop);
      client.on('close', () => toServer.end());
      up.on('close', () => toClient.end());
      // The stream to the target opens a round trip after the browser connected; what
      // the browser sent meanwhile waits in the delay line, which holds writes until
      // the socket connects.
      setTimeout(() => {
        if (upstream) up.connect(Number(upstream.port), upstream.hostname);
        else drop();
      }, rttMs);
    });
    await new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, hostAddr, resolve);
    });
    const chromium = join(dir, 'chromium');
    writeFileSync(
      chromium,
      `#!/bin/sh\nexec ip netns exec ${ns} ${process.env.CHROMIUM || '/usr/bin/chromium'} "$@"\n`,
    );
    chmodSync(chromium, 0o755);
    const url = `http://${hostAddr}:${server.address().port}`;
    const forwardTo = (target) => {
      upstream = new URL(target);
      return url;
    };
    return { host: hostAddr, forwardTo, chromium, close };
  } catch (e) {
    await close();
    throw e;
  }
}

// Writes what is pushed to `sock` `delayMs` after it was pushed, in order, without
// waiting for earlier bytes to be written: a link's latency, not a stop-and-wait.
function delayLine(sock, delayMs) {
  const queue = [];
  let timer = null;
  let ending = false;
  const flush = () => {
    timer = null;
    if (sock.connecting || sock.pending) {
      sock.once('connect', flush);
      return;
    }
    const now = performance.now();
    while (queue.length && queue[0].at <= now) {
      const { buf } = queue.shift();
      if (buf) sock.write(buf);
      else sock.end();
    }
    if (queue.length) timer = setTimeout(flush, queue[0].at - now);
  };
  const add = (buf) => {
    if (ending || sock.destroyed) return;
    if (!buf) ending = true;
    queue.push({ at: performance.now() + delayMs, buf });
    if (!timer) timer = setTimeout(flush, delayMs);
  };
  return { push: (buf) => add(buf), end: () => add(null) };
}
