#!/usr/bin/env node
// Drain benchmark: enqueue N no-op jobs up front with the peer's bulk API (not timed),
// then start the workers and time from their start until the database records the last
// job as done (graphile-worker: its row deleted; pg-boss: state 'completed').
//
//   node bench/peers/drain.mjs --peer graphile_worker|pg_boss --db URL [--jobs 200000] [--processes 1]
//
// --processes P > 1 forks P worker processes draining the same queue. Each child
// connects and loads everything first, then waits for a "go" message; the clock starts
// when "go" is sent to all of them. With P = 1 the worker runs in this process and the
// clock starts just before it is started. In both cases the clock stops when a poll of the
// database (every 5 ms, begun once the handlers have seen all N jobs, so it adds no load
// while draining) finds no unfinished job left.
// Output: {"peer":..,"workload":"drain","jobs":N,"processes":P,"seconds":S,"per_s":R}
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import {
  parseArgs, checkCommon, intArg, loadPeer, now, log, emit, round, pgModule, waitUntil, runMain,
} from './lib/common.mjs';

const USAGE = 'usage: drain.mjs --peer graphile_worker|pg_boss --db URL [--jobs 200000] [--processes 1] [--timeout 900]';
const ENQUEUE_CHUNK = 10_000;

// ---------- child (one of P worker processes) ----------
async function child(args) {
  const peer = await loadPeer(args.peer);
  let handled = 0;
  let reported = 0;
  let worker = null;
  const flush = () => {
    if (handled !== reported) {
      process.send({ type: 'count', n: handled - reported });
      reported = handled;
    }
  };
  process.on('message', async (m) => {
    if (m.type === 'go') {
      worker = await peer.startWorker(args.db, 'drain', () => { handled++; });
      process.send({ type: 'started', settings: worker.settings });
      setInterval(flush, 10).unref();
    } else if (m.type === 'stop') {
      flush();
      if (worker) await worker.stop();
      flush();
      process.send({ type: 'stopped' }, () => process.exit(0));
    }
  });
  // make sure the peer library is loaded and connections can be made before "go"
  const pg = await pgModule();
  const c = new pg.Client({ connectionString: args.db });
  await c.connect();
  await c.end();
  process.send({ type: 'ready' });
  await new Promise(() => {}); // wait for messages
}

// ---------- parent ----------
async function parent(args) {
  const jobs = intArg(args, 'jobs');
  const processes = intArg(args, 'processes');
  const timeoutMs = intArg(args, 'timeout') * 1000;
  const peer = await loadPeer(args.peer);
  const pg = await pgModule();

  log(`${peer.name} ${peer.version()}: resetting schema ${peer.schema}`);
  await peer.reset(args.db, 'drain');

  log(`enqueueing ${jobs} jobs (bulk, ${ENQUEUE_CHUNK} per call, not timed)`);
  const producer = await peer.producer(args.db);
  const te = now();
  for (let from = 0; from < jobs; from += ENQUEUE_CHUNK) {
    await producer.addBulk(from, Math.min(ENQUEUE_CHUNK, jobs - from));
  }
  await producer.release();
  log(`enqueued in ${((now() - te) / 1000).toFixed(2)} s`);

  const client = new pg.Client({ connectionString: args.db });
  await client.connect();
  const queued = await peer.remaining(client);
  if (queued !== jobs) throw new Error(`expected ${jobs} queued jobs, found ${queued}`);
  // fresh statistics for the freshly filled tables (as autovacuum would soon do anyway)
  await client.query('ANALYZE').catch((e) => log(`ANALYZE failed: ${e.message}`));

  let handled = 0;
  let t0;
  let stopAll;
  let settings;
  if (processes === 1) {
    t0 = now();
    const w = await peer.startWorker(args.db, 'drain', () => { handled++; });
    log(`worker start call took ${(now() - t0).toFixed(1)} ms (handled so far: ${handled})`);
    settings = w.settings;
    stopAll = () => w.stop();
  } else {
    const self = fileURLToPath(import.meta.url);
    const kids = [];
    let stopping = false;
    for (let i = 0; i < processes; i++) {
      const k = fork(self, ['--child', '--peer', peer.name, '--db', args.db], { stdio: ['ignore', 2, 2, 'ipc'] });
      k.ready = new Promise((res, rej) => {
        k.on('message', (m) => {
          if (m.type === 'ready') res();
          else if (m.type === 'count') handled += m.n;
          else if (m.type === 'started') settings = m.settings;
          else if (m.type === 'stopped') k.stoppedMsg = true;
        });
        k.on('exit', (code) => {
          k.exited = true;
          if (code !== 0 && !k.stoppedMsg) {
            rej(new Error(`worker process ${i} exited with code ${code}`));
            if (!stopping) { process.stderr.write(`worker process ${i} exited with code ${code}\n`); process.exit(1); }
          }
        });
      });
      kids.push(k);
    }
    await Promise.all(kids.map((k) => k.ready));
    log(`${processes} worker processes ready`);
    t0 = now();
    for (const k of kids) k.send({ type: 'go' });
    stopAll = async () => {
      stopping = true;
      await Promise.all(kids.map((k) => new Promise((res) => {
        if (k.exited) return res();
        k.on('exit', res);
        k.send({ type: 'stop' });
      })));
    };
  }
  log(`workers started, draining`);

  const progress = setInterval(() => log(`handled ${handled}/${jobs}`), 1000);
  try {
    await waitUntil(() => handled >= jobs, { intervalMs: 2, timeoutMs, what: 'all jobs handled' });
    await waitUntil(async () => (await peer.remaining(client)) === 0, { intervalMs: 5, timeoutMs, what: 'all jobs recorded as done' });
  } finally {
    clearInterval(progress);
  }
  const seconds = (now() - t0) / 1000;
  log(`drained ${jobs} jobs in ${seconds.toFixed(3)} s (handler calls: ${handled})`);
  if (settings) log(`settings: ${JSON.stringify(settings)}`);
  await stopAll();
  await client.end();
  if (handled !== jobs) log(`WARNING: handler ran ${handled} times for ${jobs} jobs`);

  emit({ peer: peer.name, workload: 'drain', jobs, processes, seconds: round(seconds, 4), per_s: Math.round(jobs / seconds) });
}

const args = parseArgs(process.argv.slice(2), { jobs: 200000, processes: 1, timeout: 900 });
if (args.child) {
  child(args).catch((e) => {
    process.stderr.write(`worker process error: ${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
  });
} else {
  runMain(async () => {
    checkCommon(args, USAGE);
    await parent(args);
  });
}
