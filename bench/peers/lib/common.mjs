// Shared helpers for the peer benchmark programs (drain.mjs, pickup.mjs, enqueue.mjs).
// Progress and diagnostics go to stderr; each program prints exactly one JSON line on stdout.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';

const here = dirname(fileURLToPath(import.meta.url));

// Packages are installed by install.sh into bench/.peers/node_modules, which is not on
// the ESM resolution path of bench/peers/*.mjs, so resolve them from there explicitly.
export const PEERS_DIR = resolve(process.env.PEERS_DIR || join(here, '..', '..', '.peers'));
const peerRequire = createRequire(join(PEERS_DIR, 'package.json'));

export async function peerImport(name) {
  let file;
  try {
    file = peerRequire.resolve(name);
  } catch (e) {
    throw new Error(`cannot find package '${name}' in ${PEERS_DIR}/node_modules: run bench/peers/install.sh first (${e.message})`);
  }
  return import(pathToFileURL(file).href);
}

export function peerVersion(name) {
  // read the file directly: some packages do not export ./package.json
  return JSON.parse(readFileSync(join(PEERS_DIR, 'node_modules', name, 'package.json'), 'utf8')).version;
}

export async function pgModule() {
  const m = await peerImport('pg');
  return m.default ?? m;
}

// --name value / --name=value / --flag
// Drops a peer's schema, so its next install starts from nothing.
export async function dropSchema(url, schema) {
  const pg = await pgModule();
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query('SET client_min_messages = warning');
    await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await c.end();
  }
}

export function parseArgs(argv, defaults = {}) {
  const out = { ...defaults };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument '${a}'`);
    let key = a.slice(2);
    let val;
    const eq = key.indexOf('=');
    if (eq >= 0) {
      val = key.slice(eq + 1);
      key = key.slice(0, eq);
    } else if (i + 1 < argv.length && !argv[i + 1].startsWith('--')) {
      val = argv[++i];
    } else {
      val = true;
    }
    key = key.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    out[key] = val;
  }
  return out;
}

export function intArg(args, name, { min = 1 } = {}) {
  const v = Number(args[name]);
  if (!Number.isInteger(v) || v < min) throw usageError(`--${name} must be an integer >= ${min}, got '${args[name]}'`);
  return v;
}

export const PEERS = ['graphile_worker', 'pg_boss'];

function usageError(msg) {
  const e = new Error(msg);
  e.usage = true;
  return e;
}

export function checkCommon(args, usage) {
  if (args.help) {
    process.stderr.write(usage + '\n');
    process.exit(0);
  }
  if (!PEERS.includes(args.peer)) throw usageError(`--peer must be one of ${PEERS.join(', ')}\n${usage}`);
  if (!args.db || args.db === true) throw usageError(`--db URL is required\n${usage}`);
}

export async function loadPeer(name) {
  const mod = await import(`./${name}.mjs`);
  return mod.default;
}

export const now = () => performance.now();
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function log(...parts) {
  process.stderr.write(`[${new Date().toISOString().slice(11, 23)}] ${parts.join(' ')}\n`);
}

export function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

export const round = (x, digits = 3) => Number(x.toFixed(digits));

// Nearest-rank percentile of an ascending-sorted array.
export function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

// Poll cond() (async -> bool) every intervalMs until true or timeoutMs elapsed.
export async function waitUntil(cond, { intervalMs = 5, timeoutMs = 600_000, what = 'condition' } = {}) {
  const t0 = now();
  for (;;) {
    if (await cond()) return;
    if (now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(intervalMs);
  }
}

// Runs main(), turns an exception into a stderr message and exit code 1.
export function runMain(main) {
  main().then(
    () => process.exit(0),
    (err) => {
      process.stderr.write(`error: ${err && err.usage ? err.message : err && err.stack ? err.stack : err}\n`);
      process.exit(1);
    },
  );
}
