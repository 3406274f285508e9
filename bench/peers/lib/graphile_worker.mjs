// graphile-worker adapter for the peer benchmarks.
//
// Schema: graphile_worker (dropped and re-created by reset()).
// A completed job is DELETEd from graphile_worker._private_jobs, so "all done" means
// that table is empty.
import { dropSchema, peerImport, peerVersion, log } from './common.mjs';

const SCHEMA = 'graphile_worker';
const TASK = 'noop';

let gw;
async function lib() {
  gw ??= await peerImport('graphile-worker');
  return gw;
}

// Worker settings for throughput (drain). These follow graphile-worker's own performance
// page / perfTest preset (worker.graphile.org/docs/performance): concurrentJobs 24,
// maxPoolSize concurrentJobs+1, a localQueue (jobs fetched+locked per round trip) with a
// 10 ms refetch delay when the queue runs short, and batched completion/failure
// (completeJobBatchDelay/failJobBatchDelay 0 = flush on the next tick, merging all
// completions made in the meantime into one statement). The preset's localQueue size is 500;
// 5000 was clearly faster on our 2-core machine (see README.md for the measurements).
// Overridable through env for experiments: GW_CONCURRENCY, GW_LOCAL_QUEUE, GW_POOL,
// GW_COMPLETE_DELAY, GW_REFETCH_MS.
function drainSettings() {
  const env = process.env;
  const concurrentJobs = Number(env.GW_CONCURRENCY ?? 24);
  const size = Number(env.GW_LOCAL_QUEUE ?? 5000);
  const refetchMs = Number(env.GW_REFETCH_MS ?? 10);
  return {
    concurrentJobs,
    maxPoolSize: Number(env.GW_POOL ?? concurrentJobs + 1),
    localQueue: refetchMs > 0 ? { size, refetchDelay: { durationMs: refetchMs } } : { size },
    completeJobBatchDelay: Number(env.GW_COMPLETE_DELAY ?? 0),
    failJobBatchDelay: Number(env.GW_COMPLETE_DELAY ?? 0),
  };
}

// Settings for pickup latency. graphile-worker always LISTENs on its "jobs:insert" channel
// (add_job issues NOTIFY on commit), so an idle worker is woken by the notification rather
// than by polling; pollInterval only matters for future-dated/retried jobs. We keep the
// default concurrency-per-process mechanics but disable the localQueue (its refetch delay
// and batch locking only add latency for a trickle of jobs) and leave completion batching
// off (-1) so the next fetch is never waiting behind a completion flush. A low
// pollInterval (100 ms) as a backstop. On this machine concurrency 4 or a small localQueue
// measured the same within noise (see README.md).
function pickupSettings() {
  const env = process.env;
  const s = {
    concurrentJobs: Number(env.GW_CONCURRENCY ?? 1),
    maxPoolSize: Number(env.GW_POOL ?? 4),
    pollInterval: 100,
    completeJobBatchDelay: Number(env.GW_COMPLETE_DELAY ?? -1),
    failJobBatchDelay: -1,
  };
  if (env.GW_LOCAL_QUEUE) s.localQueue = { size: Number(env.GW_LOCAL_QUEUE) };
  return s;
}

function makeLogger(Logger) {
  // Only warnings and errors, to stderr.
  return new Logger((scope) => (level, message) => {
    if (level === 'error' || level === 'warning') {
      process.stderr.write(`graphile-worker ${level}: ${message}\n`);
    }
  });
}

const peer = {
  name: 'graphile_worker',
  schema: SCHEMA,
  version: () => peerVersion('graphile-worker'),
  settings: { drain: drainSettings, pickup: pickupSettings },

  // Drop the schema and install it afresh (migrations are not part of any timing).
  async reset(url) {
    const { runMigrations, Logger } = await lib();
    await dropSchema(url, SCHEMA);
    await runMigrations({ connectionString: url, logger: makeLogger(Logger), preset: { worker: { schema: SCHEMA } } });
  },

  // Bulk producer: addJobs() = one call of graphile_worker.add_jobs() per batch.
  async producer(url) {
    const { makeWorkerUtils, Logger } = await lib();
    const utils = await makeWorkerUtils({
      connectionString: url,
      logger: makeLogger(Logger),
      preset: { worker: { schema: SCHEMA, maxPoolSize: 2 } },
    });
    await utils.migrate(); // no-op after reset(); makes sure the pool is connected
    await utils.withPgClient((c) => c.query('select 1'));
    return {
      async addBulk(from, count) {
        const specs = new Array(count);
        for (let k = 0; k < count; k++) specs[k] = { identifier: TASK, payload: { i: from + k } };
        await utils.addJobs(specs);
      },
      async release() {
        await utils.release();
      },
    };
  },

  // Start a worker pool. onJob(payload) is called synchronously at handler start.
  async startWorker(url, mode, onJob) {
    const { run, Logger } = await lib();
    const worker = { schema: SCHEMA, ...(mode === 'pickup' ? pickupSettings() : drainSettings()) };
    const runner = await run({
      noHandleSignals: true,
      logger: makeLogger(Logger),
      crontab: '',
      taskList: {
        [TASK]: async (payload) => {
          onJob(payload);
        },
      },
      preset: { worker: { connectionString: url, ...worker } },
    });
    return {
      settings: worker,
      // single add through the runner's own pool (add_job + NOTIFY)
      async add(payload) {
        await runner.addJob(TASK, payload);
      },
      async stop() {
        await runner.stop();
      },
    };
  },

  // Number of jobs not yet recorded as completed.
  async remaining(client) {
    const { rows } = await client.query(`select count(*)::int as n from ${SCHEMA}._private_jobs`);
    return rows[0].n;
  },
};

export default peer;
