// pg-boss adapter for the peer benchmarks.
//
// Schema: pgboss (dropped and re-created by reset()). A completed job stays in
// pgboss.job with state 'completed' (until retention/maintenance removes it), so "all
// done" means no row of the queue is in a state before 'completed'.
import { dropSchema, peerImport, peerVersion } from './common.mjs';

const SCHEMA = 'pgboss';
const QUEUE = 'noop';

let mod;
async function lib() {
  mod ??= await peerImport('pg-boss');
  return mod.PgBoss ?? mod.default;
}

// Constructor options shared by all workloads. Cron scheduling is off (we use none), the
// supervisor/maintenance stays at its defaults.
function bossOptions(url, extra = {}) {
  return {
    connectionString: url,
    schema: SCHEMA,
    schedule: false,
    ...extra,
  };
}

// Throughput settings (drain): each worker fetches a batch of jobs with one locking
// query (batchSize), the handler receives the whole array, and when it resolves pg-boss
// completes the whole batch with one statement (complete(name, ids[])). burstWhenBatchFull
// makes a worker re-fetch immediately while batches come back full instead of sleeping its
// polling interval; localConcurrency runs several such fetch/complete loops in parallel so
// the database round trips overlap. batchSize 1000 x 4 loops was the fastest combination we
// measured (README.md). Overridable through env for experiments:
// BOSS_BATCH, BOSS_CONCURRENCY, BOSS_POOL, BOSS_PARTITION.
function drainSettings() {
  const env = process.env;
  const localConcurrency = Number(env.BOSS_CONCURRENCY ?? 4);
  return {
    work: {
      batchSize: Number(env.BOSS_BATCH ?? 1000),
      localConcurrency,
      burstWhenBatchFull: true,
      pollingIntervalSeconds: 0.5, // minimum allowed
    },
    max: Number(env.BOSS_POOL ?? localConcurrency + 4),
    partition: env.BOSS_PARTITION === '1',
  };
}

// Pickup latency settings: LISTEN/NOTIFY on (constructor useListenNotify + queue
// notify:true, so every insert issues pg_notify and wakes the idle worker at once), and the
// minimum polling interval pg-boss accepts (0.5 s) as the backstop for both the plain and the
// notify-active polling mode. batchSize 10 rather than 1: same latency when the worker keeps
// up, but with 1 a worker that fell behind once (e.g. a stall) stays behind, because each
// notification wakes it for a single job and the rest waits for the next poll.
function pickupSettings() {
  const env = process.env;
  return {
    work: {
      batchSize: Number(env.BOSS_BATCH ?? 10),
      localConcurrency: Number(env.BOSS_CONCURRENCY ?? 1),
      pollingIntervalSeconds: 0.5,
      notifyPollingIntervalSeconds: 0.5,
    },
    max: Number(env.BOSS_POOL ?? 4),
    partition: env.BOSS_PARTITION === '1',
    useListenNotify: true,
  };
}

async function startBoss(url, extra) {
  const PgBoss = await lib();
  const boss = new PgBoss(bossOptions(url, extra));
  boss.on('error', (e) => process.stderr.write(`pg-boss error: ${e && e.message ? e.message : e}\n`));
  boss.on('warning', (w) => process.stderr.write(`pg-boss warning: ${w && w.message ? w.message : JSON.stringify(w)}\n`));
  await boss.start();
  return boss;
}

const peer = {
  name: 'pg_boss',
  schema: SCHEMA,
  version: () => peerVersion('pg-boss'),
  settings: { drain: drainSettings, pickup: pickupSettings },

  // Drop the schema, install it afresh and create the queue (not part of any timing).
  // mode decides the queue options (notify for pickup).
  async reset(url, mode = 'drain') {
    await dropSchema(url, SCHEMA);
    const s = mode === 'pickup' ? pickupSettings() : drainSettings();
    const boss = await startBoss(url, { supervise: false });
    await boss.createQueue(QUEUE, { notify: mode === 'pickup', partition: s.partition });
    await boss.stop({ graceful: false, close: true });
  },

  // Bulk producer: insert(name, jobs[]) = one INSERT ... json_to_recordset statement per call.
  async producer(url) {
    const boss = await startBoss(url, { supervise: false, max: 2 });
    await boss.getQueue(QUEUE); // warm the queue cache and the connection
    return {
      async addBulk(from, count) {
        const jobs = new Array(count);
        for (let k = 0; k < count; k++) jobs[k] = { data: { i: from + k } };
        await boss.insert(QUEUE, jobs);
      },
      async release() {
        await boss.stop({ graceful: false, close: true });
      },
    };
  },

  async startWorker(url, mode, onJob) {
    const s = mode === 'pickup' ? pickupSettings() : drainSettings();
    const extra = { max: s.max };
    if (s.useListenNotify) extra.useListenNotify = true;
    const boss = await startBoss(url, extra);
    await boss.getQueue(QUEUE);
    await boss.work(QUEUE, s.work, async (jobs) => {
      for (const job of jobs) onJob(job.data);
    });
    return {
      settings: { ...s.work, max: s.max, partition: s.partition, useListenNotify: !!s.useListenNotify },
      async add(payload) {
        await boss.send(QUEUE, payload);
      },
      async stop() {
        await boss.stop({ graceful: true, close: true, timeout: 10_000 });
      },
    };
  },

  async remaining(client) {
    const { rows } = await client.query(
      `select count(*)::int as n from ${SCHEMA}.job where name = $1 and state < 'completed'`,
      [QUEUE],
    );
    return rows[0].n;
  },
};

export default peer;
