#!/usr/bin/env node
// Bulk-enqueue benchmark: time ONE call of the peer's bulk API inserting N no-op jobs,
// from just before the call until it resolves (the statement has committed by then).
//   graphile_worker: workerUtils.addJobs(specs)  -> select graphile_worker.add_jobs(...)
//   pg_boss:         boss.insert(queue, jobs[])  -> one INSERT ... FROM json_to_recordset(...)
// Setup (schema reset/install, queue creation, connecting the pool) is not timed.
//
//   node bench/peers/enqueue.mjs --peer graphile_worker|pg_boss --db URL [--jobs 10000]
// Output: {"peer":..,"workload":"enqueue","jobs":N,"seconds":S,"per_s":R}
import { parseArgs, checkCommon, intArg, loadPeer, now, log, emit, round, pgModule } from './lib/common.mjs';
import { runMain } from './lib/common.mjs';

const USAGE = 'usage: enqueue.mjs --peer graphile_worker|pg_boss --db URL [--jobs 10000]';

runMain(async () => {
  const args = parseArgs(process.argv.slice(2), { jobs: 10000 });
  checkCommon(args, USAGE);
  const jobs = intArg(args, 'jobs');
  const peer = await loadPeer(args.peer);

  log(`${peer.name} ${peer.version()}: resetting schema ${peer.schema}`);
  await peer.reset(args.db, 'enqueue');
  const producer = await peer.producer(args.db);

  log(`inserting ${jobs} jobs with one bulk call`);
  const t0 = now();
  await producer.addBulk(0, jobs);
  const seconds = (now() - t0) / 1000;
  await producer.release();

  // sanity check: all N jobs are there
  const pg = await pgModule();
  const c = new pg.Client({ connectionString: args.db });
  await c.connect();
  const n = await peer.remaining(c);
  await c.end();
  if (n !== jobs) throw new Error(`expected ${jobs} queued jobs, found ${n}`);

  log(`done in ${seconds.toFixed(3)} s`);
  emit({ peer: peer.name, workload: 'enqueue', jobs, seconds: round(seconds, 4), per_s: Math.round(jobs / seconds) });
});
