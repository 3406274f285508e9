#!/usr/bin/env node
// Pickup-latency benchmark: an idle worker runs in this process; one job is added every
// 10 ms (100/s, fixed-rate schedule) through the peer's normal single-job API
// (graphile-worker runner.addJob -> add_job + NOTIFY; pg-boss send -> INSERT + pg_notify).
// For each job we take performance.now() just before the add call and again when the add
// call resolves; the handler takes performance.now() when it starts. Latency = handler
// start - before add. The first 50 jobs are warm-up and ignored.
// Each peer runs its lowest-latency configuration (LISTEN/NOTIFY wake-up; see the
// pickupSettings() comments in lib/graphile_worker.mjs and lib/pg_boss.mjs).
//
//   node bench/peers/pickup.mjs --peer graphile_worker|pg_boss --db URL [--jobs 1000]
// Output: {"peer":..,"workload":"pickup","jobs":N,"p50_ms":..,"p99_ms":..,"max_ms":..,
//          "mean_ms":..,"add_p50_ms":..,"add_p99_ms":..}
//   (add_*: duration of the add call itself, i.e. until it resolved/committed)
import {
  parseArgs, checkCommon, intArg, loadPeer, now, log, emit, round, sleep, waitUntil, percentile, runMain,
} from './lib/common.mjs';

const USAGE = 'usage: pickup.mjs --peer graphile_worker|pg_boss --db URL [--jobs 1000] [--interval-ms 10] [--warmup 50]';

runMain(async () => {
  const args = parseArgs(process.argv.slice(2), { jobs: 1000, intervalMs: 10, warmup: 50 });
  checkCommon(args, USAGE);
  const jobs = intArg(args, 'jobs');
  const intervalMs = intArg(args, 'intervalMs');
  const warmup = intArg(args, 'warmup', { min: 0 });
  if (jobs <= warmup) throw new Error(`--jobs must be larger than --warmup (${warmup})`);
  const peer = await loadPeer(args.peer);

  log(`${peer.name} ${peer.version()}: resetting schema ${peer.schema}`);
  await peer.reset(args.db, 'pickup');

  const before = new Float64Array(jobs).fill(NaN);
  const after = new Float64Array(jobs).fill(NaN);
  const started = new Float64Array(jobs).fill(NaN);
  let handled = 0;
  const w = await peer.startWorker(args.db, 'pickup', (payload) => {
    const t = now();
    const i = payload && payload.i;
    if (Number.isInteger(i) && i >= 0 && i < jobs && Number.isNaN(started[i])) {
      started[i] = t;
      handled++;
    }
  });
  log(`worker settings: ${JSON.stringify(w.settings)}`);
  await sleep(1000); // let the worker go idle (listening)

  log(`adding ${jobs} jobs, one every ${intervalMs} ms`);
  const tStart = now();
  for (let i = 0; i < jobs; i++) {
    const target = tStart + i * intervalMs;
    let wait = target - now();
    if (wait > 1) await sleep(wait - 1);
    while (now() < target) { /* spin the last ms for an accurate schedule */ }
    before[i] = now();
    await w.add({ i });
    after[i] = now();
  }
  await waitUntil(() => handled >= jobs, { intervalMs: 5, timeoutMs: 30_000, what: 'all jobs picked up' });
  await w.stop();

  const lat = [];
  const addDur = [];
  for (let i = warmup; i < jobs; i++) {
    lat.push(started[i] - before[i]);
    addDur.push(after[i] - before[i]);
  }
  lat.sort((a, b) => a - b);
  addDur.sort((a, b) => a - b);
  const mean = lat.reduce((s, x) => s + x, 0) / lat.length;
  const res = {
    peer: peer.name,
    workload: 'pickup',
    jobs,
    p50_ms: round(percentile(lat, 50)),
    p99_ms: round(percentile(lat, 99)),
    max_ms: round(lat[lat.length - 1]),
    mean_ms: round(mean),
    add_p50_ms: round(percentile(addDur, 50)),
    add_p99_ms: round(percentile(addDur, 99)),
  };
  log(`measured ${lat.length} jobs (first ${warmup} ignored)`);
  if (process.env.PICKUP_TRACE) {
    // per-job latency series, for diagnosing stalls
    const series = [];
    for (let i = 0; i < jobs; i++) series.push((started[i] - before[i]).toFixed(1));
    log(`latency series (ms): ${series.join(' ')}`);
  }
  emit(res);
});
