// The trnflow dashboard: one script for every page. Data comes from /api (the JSON the CLI
// prints with --format json); live changes from /api/events (Server-Sent Events). No
// framework, nothing fetched from elsewhere.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Dollars as the CLI prints them (Money::ToDollars): micro-dollars rounded half up to cents.
function micros(usd) { return Math.round((usd || 0) * 1e6); }
function dollarsMicros(m) {
  const a = Math.abs(m);
  const cents = Math.floor((a + 5000) / 10000);
  return (m < 0 && cents > 0 ? '-' : '') + '$' + Math.floor(cents / 100) + '.' + String(cents % 100).padStart(2, '0');
}
function dollars(usd) { return dollarsMicros(micros(usd)); }

function duration(seconds) {
  if (seconds === null || seconds === undefined || isNaN(seconds)) return '';
  if (seconds < 60) return seconds.toFixed(1) + 's';
  if (seconds < 3600) return (seconds / 60).toFixed(1) + 'm';
  return (seconds / 3600).toFixed(2) + 'h';
}

async function api(path) {
  return (await apiAnswer(path)).body;
}
// The answer and, for a read asked ?after= a change, the newest change it shows (the dashboard
// may answer with what it had while it reads anew: then this is older than what was asked).
async function apiAnswer(path) {
  const r = await fetch(path, { headers: { Accept: 'application/json' }, credentials: 'same-origin' });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return { body, change: Number(r.headers.get('X-Trnflow-Change') || Infinity),
    latest: Number(r.headers.get('X-Trnflow-Latest') || 0) };
}

// A run stopped by its budget is "over budget", as the CLI says; its state stays `cancelled`.
function stateBadge(state, r) {
  const word = r && r.cancel_reason === 'budget_exceeded' ? 'over budget' : state;
  return el('span', { class: 'state state-' + state }, word);
}

function showError(e) {
  const main = document.getElementById('main');
  main.replaceChildren(el('p', { class: 'error', id: 'error' }, String(e.message || e)));
}

// A table whose columns sort on a click. cols: [{key, label, num, fmt, sort, class}]; rows:
// objects; `class` is given to the column's cells (`wrap`: long text wraps).
function sortableTable(id, cols, rows, totalRow) {
  let sortKey = null, asc = true;
  const table = el('table', { id });
  const render = () => {
    const sorted = rows.slice();
    if (sortKey) {
      const col = cols.find(c => c.key === sortKey);
      const val = col.sort || (r => r[col.key]);
      sorted.sort((a, b) => {
        const x = val(a), y = val(b);
        const c = x === y ? 0 : (x === null || x === undefined) ? -1 : (y === null || y === undefined) ? 1 : x < y ? -1 : 1;
        return asc ? c : -c;
      });
    }
    const head = el('tr', {}, cols.map(c => el('th', {
      class: c.num ? 'num' : null, 'data-key': c.key,
      onclick: () => { if (sortKey === c.key) asc = !asc; else { sortKey = c.key; asc = true; } render(); },
    }, c.label + (sortKey === c.key ? (asc ? ' ▲' : ' ▼') : ''))));
    const body = sorted.map(r => el('tr', {}, cols.map(c => {
      const v = c.fmt ? c.fmt(r[c.key], r) : r[c.key];
      return el('td', { class: [c.num ? 'num' : null, c.class].filter(Boolean).join(' ') || null, id: c.id ? c.id(r) : null },
        v instanceof Node ? v : (v === null || v === undefined ? '' : String(v)));
    })));
    const foot = totalRow ? [el('tr', { class: 'total' }, cols.map(c => el('td', {
      class: c.num ? 'num' : null, id: totalRow[c.key] !== undefined ? id + '-total-' + c.key : null,
    }, totalRow[c.key] === undefined ? '' : totalRow[c.key])))] : [];
    table.replaceChildren(el('thead', {}, head), el('tbody', {}, body, foot));
  };
  render();
  return table;
}

// --- live updates -------------------------------------------------------------------------
// Every page registers how to follow changes (`onChange`) and how to re-read itself
// (`refresh`): the event stream drives the first; when the server refuses a stream (too many,
// a proxy without streaming), the page polls with the second every 5 s instead.
// `?live=0` in a page's URL turns both off: a still page (screenshots, printing, slow links).
const LIVE = new URLSearchParams(location.search).get('live') !== '0';
const listeners = [];
let source = null, polling = null, refresh = null;
// The newest change this page has been told of: reads ask for answers that show it
// (?after=ID), which the dashboard shares among the pages told of the same change.
let lastChange = 0;
function onChange(fn, reread) {
  listeners.push(fn);
  refresh = reread || refresh;
  if (source || !LIVE) return;
  source = new EventSource('/api/events');
  const live = document.getElementById('live');
  source.addEventListener('open', () => { live.classList.add('on'); live.title = 'live'; });
  source.addEventListener('error', () => {
    live.classList.remove('on');
    if (source.readyState === EventSource.CLOSED && !polling && refresh) {
      live.title = 'polling every 5 s';
      polling = setInterval(refresh, 5000);
    }
  });
  source.addEventListener('change', ev => {
    const c = JSON.parse(ev.data);
    lastChange = Math.max(lastChange, Number(ev.lastEventId || c.id) || 0);
    for (const f of listeners) f(c);
  });
}

// Reads `path` with `params` as of the newest change this page was told of (none yet: as of
// now, ?after=latest; pages opening together share one read). An answer older than what was
// asked for (or, opening, than the newest change then: X-Trnflow-Latest) is shown, and
// `again` (a throttled reload) asks once more.
async function readAfter(path, params, again) {
  const p = new URLSearchParams(params);
  const asked = lastChange;
  p.set('after', asked > 0 ? asked : 'latest');
  const a = await apiAnswer(`${path}?${p}`);
  if (a.change < Math.max(asked, a.latest)) again();
  return a.body;
}

// Calls `fn` at once when idle; while a call is in flight, once more after it, `ms` (or twice
// as long as the last call took) after that call began: a steady stream of changes becomes a
// read every `ms`, never a queue of reads, and a slow server is asked less often.
function throttle(fn, ms) {
  let running = false, wanted = false, timer = null, next = 0;
  const go = async () => {
    timer = null; running = true; wanted = false;
    const t0 = Date.now();
    try { await fn(); } catch (e) { /* the next change tries again */ }
    running = false;
    next = t0 + Math.max(ms, 2 * (Date.now() - t0));
    if (wanted) schedule();
  };
  const schedule = () => { if (!timer && !running) timer = setTimeout(go, Math.max(0, next - Date.now())); };
  return () => { wanted = true; schedule(); };
}

// --- pages --------------------------------------------------------------------------------
async function pageRuns(main) {
  const q = new URLSearchParams(location.search);
  const form = el('form', { class: 'filters', method: 'get', action: '/runs' },
    el('input', { name: 'project', placeholder: 'project', value: q.get('project') || '' }),
    el('input', { name: 'pipeline', placeholder: 'pipeline', value: q.get('pipeline') || '' }),
    el('select', { name: 'state' }, ['', 'running', 'succeeded', 'failed', 'cancelled'].map(s => {
      const o = el('option', { value: s }, s || 'any state');
      if (q.get('state') === s) o.selected = true;
      return o;
    })),
    el('input', { name: 'since', placeholder: 'since (2026-11-01 or 7d)', value: q.get('since') || '' }),
    el('button', { type: 'submit' }, 'Filter'));
  const params = new URLSearchParams();
  for (const k of ['project', 'pipeline', 'state', 'since']) if (q.get(k)) params.set(k, q.get(k));
  const holder = el('div');
  main.replaceChildren(el('h1', {}, 'Runs'), form, holder);
  const load = async () => {
    const runs = await readAfter('/api/runs', params, () => reload());
    const now = Date.now();
    for (const r of runs) {
      const end = r.finished_at ? Date.parse(r.finished_at) : now;
      r.duration_s = (end - Date.parse(r.created_at)) / 1000;
    }
    let total = 0, wasted = 0;
    for (const r of runs) { total += micros(r.cost_usd); wasted += micros(r.wasted_usd); }
    holder.replaceChildren(runs.length === 0 ? el('p', { class: 'muted' }, 'no runs') : sortableTable('runs', [
      { key: 'run_id', label: 'Run', num: true, sort: r => Number(r.run_id), fmt: v => el('a', { href: '/runs/' + v }, v) },
      { key: 'pipeline', label: 'Pipeline' },
      { key: 'project', label: 'Project' },
      { key: 'state', label: 'State', fmt: stateBadge },
      { key: 'created_at', label: 'Created' },
      { key: 'duration_s', label: 'Duration', num: true, fmt: duration },
      { key: 'cost_usd', label: 'Cost', num: true, fmt: dollars },
      { key: 'wasted_usd', label: 'Wasted', num: true, fmt: dollars },
    ], runs, { run_id: 'total', cost_usd: dollarsMicros(total), wasted_usd: dollarsMicros(wasted) }));
  };
  const reload = throttle(load, 1000);
  await load();
  onChange(reload, load);
}

// Longest-path depth of each stage from its roots: the DAG's columns.
function layers(stages) {
  const byName = new Map(stages.map(s => [s.name, s]));
  const depth = new Map();
  const visit = (s, seen) => {
    if (depth.has(s.name)) return depth.get(s.name);
    if (seen.has(s.name)) return 0;
    seen.add(s.name);
    let d = 0;
    for (const n of s.needs || []) if (byName.has(n)) d = Math.max(d, visit(byName.get(n), seen) + 1);
    depth.set(s.name, d);
    return d;
  };
  for (const s of stages) visit(s, new Set());
  return depth;
}

function stageCost(s) {
  return micros(s.cost_usd) + micros(s.running_cost_usd || 0);
}

// A running stage's progress as the CLI prints it (`trnflow watch`, `show`): "42%, 5.3 sim h
// left (~3s)", from the progress and ETA its worker reports; '' when it reports none.
function progressText(s, speed) {
  if (s.state !== 'running' || s.progress === null || s.progress === undefined) return '';
  let t = `${(100 * s.progress).toFixed(0)}%`;
  if (s.eta_sim_seconds !== null && s.eta_sim_seconds !== undefined)
    t += `, ${(s.eta_sim_seconds / 3600).toFixed(1)} sim h left (~${Math.ceil(s.eta_sim_seconds / Math.max(speed || 1, 1e-9))}s)`;
  return t;
}

// Expanded matrix stages are told apart by the keys whose values differ between them: of
// compile[batch=1,model=llama,seq_len=512] and compile[batch=8,model=llama,seq_len=512] the
// label is compile[batch=1] and compile[batch=8]; the full name stays in the tooltip.
function matrixLabels(stages) {
  const parse = name => {
    const base = matrixBase(name);
    if (!base) return null;
    const pairs = name.slice(base.length + 1, -1).split(',').map(p => p.split('='));
    if (pairs.some(p => p.length !== 2)) return null;
    return { base, pairs };
  };
  const values = new Map();  // base -> key -> Set of values
  for (const s of stages) {
    const m = parse(s.name);
    if (!m) continue;
    if (!values.has(m.base)) values.set(m.base, new Map());
    for (const [k, v] of m.pairs) {
      if (!values.get(m.base).has(k)) values.get(m.base).set(k, new Set());
      values.get(m.base).get(k).add(v);
    }
  }
  const labels = new Map();
  for (const s of stages) {
    const m = parse(s.name);
    if (!m) { labels.set(s.name, s.name); continue; }
    const vary = m.pairs.filter(([k]) => values.get(m.base).get(k).size > 1);
    labels.set(s.name, vary.length ? `${m.base}[${vary.map(p => p.join('=')).join(',')}]` : s.name);
  }
  return labels;
}

function clip(text, n) { return text.length > n ? text.slice(0, n - 1) + '…' : text; }

// A node's name: whole up to 40 characters (squeezed into the box past 26), cut beyond.
function nameText(label, width) {
  const long = label.length > 26;
  return svg('text', { x: 8, y: 18, class: 'name', 'data-label': label,
    textLength: long ? width : null, lengthAdjust: long ? 'spacingAndGlyphs' : null }, clip(label, 40));
}

// Stages whose state changed on this page through the event stream (not a reload): how often.
const liveChanges = new Map();

// Matrix fan-outs: the dashboard reads a run with its matrix stages collapsed (`trnflow show
// --collapse`): one entry with how many expansions are in each state. A click (or
// ?expand=NAME,... or ?expand=all in the URL) reads them one by one; "collapse" folds them
// again.
const expanded = new Set((new URLSearchParams(location.search).get('expand') || '').split(',').filter(Boolean));
let reloadRun = () => {};
function matrixBase(name) {
  const i = name.indexOf('[');
  return i > 0 && name.endsWith(']') ? name.slice(0, i) : null;
}
const STATE_ORDER = ['succeeded', 'cached', 'running', 'ready', 'retry_wait', 'blocked', 'failed', 'skipped', 'cancelled'];

function drawDag(run) {
  const stages = run.stages;
  const depth = layers(stages);
  const cols = new Map();
  for (const s of stages) {
    const d = depth.get(s.name);
    if (!cols.has(d)) cols.set(d, []);
    cols.get(d).push(s);
  }
  const W = 190, H = 54, GX = 60, GY = 16, PAD = 14;
  const pos = new Map();
  let maxRows = 0;
  for (const [d, list] of cols) {
    list.forEach((s, i) => pos.set(s.name, { x: PAD + d * (W + GX), y: PAD + i * (H + GY) }));
    maxRows = Math.max(maxRows, list.length);
  }
  const width = PAD * 2 + cols.size * (W + GX) - GX;
  const height = PAD * 2 + maxRows * (H + GY) - GY;
  const root = svg('svg', { id: 'dag', width, height, viewBox: `0 0 ${width} ${height}` });
  const label = matrixLabels(stages);
  const speed = run.run.speed;
  for (const s of stages) for (const n of s.needs || []) {
    const a = pos.get(n), b = pos.get(s.name);
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    root.append(svg('path', { class: 'edge', d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }));
  }
  for (const s of stages) {
    const p = pos.get(s.name);
    if (s.matrix) {
      const m = s.matrix;
      const counts = STATE_ORDER.filter(k => m.states[k]).map(k => `${m.states[k]} ${k}`).join(' · ');
      const g = svg('g', { class: 'node matrix', 'data-stage': s.name, 'data-state': s.state,
        'data-count': m.count, 'data-counts': STATE_ORDER.filter(k => m.states[k]).map(k => `${k}:${m.states[k]}`).join(','),
        transform: `translate(${p.x},${p.y})` },
        svg('title', {}, `${s.name}: ${m.count} matrix stages (${counts}); click to show them`),
        svg('rect', { width: W, height: H }),
        svg('rect', { class: 'stack', x: 3, y: -3, width: W, height: H }),
        svg('rect', { width: W, height: H }),
        svg('text', { x: 8, y: 18, class: 'name' }, `${s.name.length > 20 ? s.name.slice(0, 19) + '…' : s.name} ×${m.count}`),
        svg('text', { x: 8, y: 36, class: 'sub state-text counts' }, counts.length > 34 ? counts.slice(0, 33) + '…' : counts),
        svg('text', { x: 8, y: 49, class: 'sub' }, `${m.attempts} attempts · ${dollarsMicros(stageCost(s))}`));
      g.addEventListener('click', () => { expanded.add(s.name); if (reloadRun) reloadRun(); });
      root.append(g);
      continue;
    }
    const progress = progressText(s, speed);
    const g = svg('g', { class: 'node', 'data-stage': s.name, 'data-state': s.state,
      'data-live-changes': liveChanges.get(s.name) || null, transform: `translate(${p.x},${p.y})` },
      svg('title', {}, `${s.name}: ${s.state}` + (progress ? `, ${progress}` : '') + (s.last_message ? ` — ${s.last_message}` : '')),
      svg('rect', { width: W, height: H }),
      nameText(label.get(s.name), W - 16),
      svg('text', { x: 8, y: 36, class: 'sub' }, svg('tspan', { class: 'state-text' }, s.state),
        progress ? svg('tspan', { class: 'progress', 'data-progress': s.progress.toFixed(4) }, ` · ${clip(progress, 22)}`) : null),
      svg('text', { x: 8, y: 49, class: 'sub' },
        `${s.attempts.length} attempt${s.attempts.length === 1 ? '' : 's'} · ${dollarsMicros(stageCost(s))}` +
        (s.state === 'cached' ? ' · cache hit' : '')));
    root.append(g);
  }
  return root;
}

function drawTimeline(run) {
  const attempts = [];
  for (const s of run.stages) for (const a of s.attempts) attempts.push({ stage: s.name, ...a, live_cost_usd: s.running_cost_usd || 0 });
  // A collapsed matrix stage is one lane with one bar: from its first start to its last end.
  const groups = run.stages.filter(s => s.matrix && s.matrix.first_started_at);
  const starts = attempts.map(a => Date.parse(a.queued_at || a.started_at))
    .concat(groups.map(s => Date.parse(s.matrix.first_queued_at || s.matrix.first_started_at))).filter(x => !isNaN(x));
  if (starts.length === 0) return el('p', { class: 'muted', id: 'timeline' }, 'no attempts yet');
  const now = Date.now();
  const ends = attempts.map(a => a.finished_at ? Date.parse(a.finished_at) : now)
    .concat(groups.map(s => s.matrix.last_finished_at ? Date.parse(s.matrix.last_finished_at) : now));
  const t0 = Math.min(...starts), t1 = Math.max(t0 + 1, ...ends);
  const LABEL = 200, W = 760, LANE = 22, PAD = 10;
  const lanes = run.stages.map(s => s.name);
  const short = matrixLabels(run.stages);
  const laneLabel = new Map(run.stages.map(s => [s.name, s.matrix ? `${s.name} ×${s.matrix.count}` : short.get(s.name)]));
  const height = PAD * 2 + lanes.length * LANE + 18;
  const x = t => LABEL + ((t - t0) / (t1 - t0)) * W;
  const root = svg('svg', { id: 'timeline', width: LABEL + W + PAD * 2, height });
  lanes.forEach((name, i) => {
    const y = PAD + i * LANE;
    root.append(svg('line', { class: 'axis', x1: LABEL, x2: LABEL + W, y1: y + LANE - 2, y2: y + LANE - 2 }));
    const label = laneLabel.get(name);
    // Whole up to 40 characters (squeezed into the label's room past 28), the name on hover.
    const long = label.length > 28;
    root.append(svg('text', { class: 'lane-label', 'data-stage': name, x: 4, y: y + 15,
      textLength: long ? LABEL - 12 : null, lengthAdjust: long ? 'spacingAndGlyphs' : null }, clip(label, 40), svg('title', {}, name)));
  });
  for (const s of groups) {
    const m = s.matrix;
    const y = PAD + lanes.indexOf(s.name) * LANE + 3;
    const st = Date.parse(m.first_started_at), e = m.last_finished_at ? Date.parse(m.last_finished_at) : now;
    const q = m.first_queued_at ? Date.parse(m.first_queued_at) : NaN;
    if (!isNaN(q) && q < st)
      root.append(svg('rect', { class: 'wait', 'data-stage': s.name, x: x(q), y: y + 3, width: Math.max(1, x(st) - x(q)), height: LANE - 14 },
        svg('title', {}, `${s.name}: ${duration((st - q) / 1000)} from the first expansion ready to the first start`)));
    const outcomes = Object.entries(m.outcomes).map(([k, v]) => `${v} ${k}`).join(', ');
    const tip = `${s.name}: ${m.count} matrix stages, ${m.attempts} attempts (${outcomes}), ${dollarsMicros(stageCost(s))}`;
    const all = Object.keys(m.outcomes);
    const outcome = all.length === 1 ? all[0] : all.includes('running') ? 'running' : 'mixed';
    const bx = x(st), bw = Math.max(3, x(e) - x(st));
    root.append(svg('rect', { class: `attempt group outcome-${outcome}`, 'data-stage': s.name, 'data-attempts': m.attempts,
      'data-outcome': outcome, x: bx, y, width: bw, height: LANE - 8 }, svg('title', {}, tip)));
    const lost = ['spot_interruption', 'capacity_unavailable', 'lost'].reduce((t, k) => t + (m.outcomes[k] || 0), 0);
    if (lost > 0)
      root.append(svg('text', { class: 'interruption', 'data-stage': s.name, 'data-count': lost, x: bx + bw + 2, y: y + 12 },
        `✕${lost}`, svg('title', {}, tip)));
  }
  for (const a of attempts) {
    const i = lanes.indexOf(a.stage);
    const y = PAD + i * LANE + 3;
    const s = Date.parse(a.started_at), e = a.finished_at ? Date.parse(a.finished_at) : now;
    const outcome = a.outcome || 'running';
    const bx = x(s), bw = Math.max(3, x(e) - x(s));
    const tip = `${a.stage} attempt ${a.attempt}: ${outcome} on ${a.instance_type} (${a.market}), ` +
      (a.outcome ? `${a.sim_hours.toFixed(2)} sim h, ${dollars(a.cost_usd)}` : `${dollars(a.live_cost_usd)} so far`) +
      (a.message ? ` — ${a.message}` : '');
    // Queue wait: from the stage becoming ready to this attempt starting, drawn before its bar.
    const q = a.queued_at ? Date.parse(a.queued_at) : NaN;
    if (!isNaN(q) && q < s) {
      root.append(svg('rect', { class: 'wait', 'data-stage': a.stage, 'data-attempt': a.attempt,
        'data-wait-seconds': ((s - q) / 1000).toFixed(3), x: x(q), y: y + 3, width: Math.max(1, x(s) - x(q)), height: LANE - 14 },
        svg('title', {}, `${a.stage} attempt ${a.attempt}: waited ${duration((s - q) / 1000)} for a worker`)));
    }
    root.append(svg('rect', {
      class: `attempt outcome-${outcome} market-${a.market}`, 'data-stage': a.stage,
      'data-attempt': a.attempt, 'data-outcome': outcome, x: bx, y, width: bw, height: LANE - 8,
    }, svg('title', {}, tip)));
    if (outcome === 'spot_interruption' || outcome === 'capacity_unavailable' || outcome === 'lost')
      root.append(svg('text', { class: 'interruption', 'data-stage': a.stage, 'data-outcome': outcome,
        x: bx + bw + 2, y: y + 12 }, '✕', svg('title', {}, tip)));
    // Its last checkpoint, when it ended before finishing: the work after it (the wasted share
    // of its cost) was lost; the next attempt resumes from it.
    const lostShare = a.cost_usd > 0 ? Math.min(1, (a.wasted_usd || 0) / a.cost_usd) : 0;
    if (a.outcome && a.outcome !== 'succeeded' && a.outcome !== 'cached' && a.progress_to > a.progress_from) {
      const cx = bx + bw * (1 - lostShare);
      root.append(svg('line', { class: 'checkpoint', 'data-stage': a.stage, 'data-attempt': a.attempt,
        'data-progress': a.progress_to.toFixed(4), x1: cx, x2: cx, y1: y - 2, y2: y + LANE - 6 },
        svg('title', {}, `${a.stage} attempt ${a.attempt}: last checkpoint at ${(100 * a.progress_to).toFixed(1)}%` +
          (lostShare > 0 ? `; ${dollars(a.wasted_usd)} of work after it was lost` : ''))));
    }
    if (a.progress_from > 0)
      root.append(svg('text', { class: 'resume', 'data-stage': a.stage, 'data-attempt': a.attempt,
        'data-progress': a.progress_from.toFixed(4), x: bx + 2, y: y + 11 }, '↻',
        svg('title', {}, `${a.stage} attempt ${a.attempt}: resumed from its checkpoint at ${(100 * a.progress_from).toFixed(1)}%`)));
  }
  root.append(svg('text', { x: LABEL, y: height - 4, class: 'sub' }, new Date(t0).toISOString().slice(11, 19) + ' UTC'));
  root.append(svg('text', { x: LABEL + W - 60, y: height - 4, class: 'sub' }, new Date(t1).toISOString().slice(11, 19)));
  return root;
}

// Cancel, resume and retry: POSTed with the CSRF token of /api/me; the catalog and the
// dashboard decide whether this person may (a writer of the run's project).
async function act(id, action, stage, note) {
  if (!me) await whoami();
  const q = stage ? '?stage=' + encodeURIComponent(stage) : '';
  note.textContent = action + '…';
  try {
    const r = await fetch(`/api/runs/${id}/${action}${q}`, {
      method: 'POST', credentials: 'same-origin', headers: { 'X-CSRF-Token': me ? me.csrf_token : '' } });
    const body = await r.json().catch(() => ({ error: r.statusText }));
    note.textContent = r.ok ? `${action}: done` : `${action}: ${body.error}`;
    note.className = r.ok ? 'muted' : 'error';
  } catch (e) {
    note.textContent = `${action}: ${e.message}`;
    note.className = 'error';
  }
}

function actions(run) {
  const r = run.run;
  const note = el('span', { id: 'action-note', class: 'muted' });
  const stage = el('select', { id: 'retry-stage' }, run.stages.map(s => el('option', { value: s.name }, s.name)));
  return el('div', { class: 'filters', id: 'actions' },
    r.state === 'running' ? el('button', { id: 'cancel', onclick: () => act(r.run_id, 'cancel', null, note) }, 'Cancel run') : null,
    r.state === 'failed' || r.state === 'cancelled'
      ? el('button', { id: 'resume', onclick: () => act(r.run_id, 'resume', null, note) }, 'Resume run') : null,
    r.state !== 'running' ? [stage, el('button', { id: 'retry', onclick: () => act(r.run_id, 'retry', stage.value, note) }, 'Retry stage')] : null,
    note);
}

// The log of a run: stage's attempt, tailed: each read asks /api/runs/ID/log for what follows
// the bytes it has and appends them; it reads again every second (and at once when the stage
// changes) until the attempt has ended and the whole file is shown. When the stage is tried
// again, it moves to the new attempt (unless someone chose an attempt in the list).
function logPanel(id) {
  const q = new URLSearchParams(location.search);
  const pick = el('select', { id: 'log-pick' });
  const text = el('pre', { id: 'log-text', class: 'log' });
  const note = el('p', { class: 'muted', id: 'log-note' });
  const panel = el('div', { id: 'logs' }, el('h2', {}, 'Logs'), pick, note, text);
  let current = null, offset = 0, reads = 0, allReads = 0, timer = null, busy = false, stages = [];
  // Following the stage's newest attempt (a retry moves to the next), until someone picks one.
  let following = true;
  const choose = (stage, attempt) => {
    current = { stage, attempt };
    offset = 0; reads = 0;
    text.textContent = '';
    for (const k of ['data-stage', 'data-attempt', 'data-complete', 'data-reads']) text.removeAttribute(k);
    text.setAttribute('data-stage', stage);
    text.setAttribute('data-attempt', attempt);
    note.textContent = '';
    clearTimeout(timer);
    read();
  };
  const read = async () => {
    if (!current || busy) return;
    busy = true;
    const want = current;
    try {
      const p = new URLSearchParams({ stage: want.stage, attempt: want.attempt, offset });
      const r = await api(`/api/runs/${id}/log?${p}`);
      if (want !== current) return;
      reads++;
      allReads++;
      text.setAttribute('data-reads', reads);
      text.setAttribute('data-reads-all', allReads);
      if (r.available) {
        if (r.text) text.append(document.createTextNode(r.text));
        offset = r.next_offset;
        note.textContent = `${want.stage} attempt ${want.attempt}: ${r.outcome || 'running'}, ${offset} bytes`;
      } else {
        note.textContent = r.path ? `not on this host: ${r.path} (its worker's TRNFLOW_HOME)` : 'no log yet';
      }
      const more = r.available && r.next_offset < r.size;
      text.setAttribute('data-complete', r.complete ? 'true' : 'false');
      if (more) timer = setTimeout(read, 0);
      else if (!r.complete && LIVE) timer = setTimeout(read, 1000);
    } catch (e) {
      note.textContent = 'log: ' + e.message;
    } finally {
      busy = false;
    }
  };
  pick.addEventListener('change', () => {
    following = false;
    const [st, at] = JSON.parse(pick.value);
    choose(st, at);
  });
  return {
    panel,
    // Called with each reading of the run: the choice of logs, and the first one to show (the
    // URL's ?log=STAGE, else a running run: stage, else the last that ran).
    update(run) {
      const runStages = run.stages.filter(s => s.kind === 'run' && s.attempts.length > 0);
      const key = runStages.map(s => s.name + ':' + s.attempts.length).join('|');
      if (key !== stages) {
        stages = key;
        const value = current ? JSON.stringify([current.stage, current.attempt]) : null;
        pick.replaceChildren(...runStages.flatMap(s => s.attempts.map(a =>
          el('option', { value: JSON.stringify([s.name, a.attempt]) }, `${s.name} · attempt ${a.attempt}${a.outcome ? '' : ' (running)'}`))));
        if (value) pick.value = value;
      }
      panel.hidden = runStages.length === 0;
      if (current && following) {
        const s = runStages.find(x => x.name === current.stage);
        const a = s && s.attempts[s.attempts.length - 1];
        if (a && a.attempt > current.attempt) {
          pick.value = JSON.stringify([s.name, a.attempt]);
          choose(s.name, a.attempt);
        }
      }
      if (!current && runStages.length > 0) {
        const wanted = runStages.find(s => s.name === q.get('log')) || runStages.find(s => s.state === 'running') ||
          runStages[runStages.length - 1];
        const a = wanted.attempts[wanted.attempts.length - 1];
        pick.value = JSON.stringify([wanted.name, a.attempt]);
        choose(wanted.name, a.attempt);
      }
    },
    changed(stage) { if (current && current.stage === stage) { clearTimeout(timer); read(); } },
  };
}

// The timeline's key: each swatch is drawn with the very classes of the bars it stands for,
// so its colour is theirs by construction.
const LEGEND = [
  ['wait', 'waiting for a worker (ready → started)'],
  ['attempt outcome-running', 'running'],
  ['attempt outcome-succeeded', 'succeeded'],
  ['attempt outcome-cached', 'cached'],
  ['attempt outcome-spot_interruption', 'interrupted (spot, capacity, lost)'],
  ['attempt outcome-failed', 'failed, timed out, cancelled, over budget'],
  ['attempt outcome-mixed', 'matrix stage, mixed outcomes'],
  ['attempt outcome-succeeded market-spot', 'dashed outline: spot'],
];
function legend() {
  return el('div', { class: 'legend', id: 'legend' },
    LEGEND.map(([cls, text]) => el('span', { 'data-class': cls },
      svg('svg', { class: 'swatch', width: 14, height: 10 }, svg('rect', { class: cls, x: 0.5, y: 0.5, width: 13, height: 9 })), text)),
    el('span', {}, '✕ interrupted'), el('span', {}, '| last checkpoint'), el('span', {}, '↻ resumed from a checkpoint'));
}

async function pageRun(main, id) {
  const logs = logPanel(id);
  let last = null;
  const draw = run => {
    last = run;
    const r = run.run;
    let total = 0;
    for (const s of run.stages) total += stageCost(s);
    const { wasted_usd: wastedUsd, attempts, spot_interruptions: interruptions } = run.totals;
    const wasted = micros(wastedUsd);
    // Matrix stages shown one by one: each may be folded again.
    const folded = [...new Set(run.stages.map(s => matrixBase(s.name)).filter(b => b && (expanded.has('all') || expanded.has(b))))];
    main.replaceChildren(
      el('h1', {}, `Run ${r.run_id} · ${r.pipeline} `, stateBadge(r.state, r)),
      r.holder_gone ? el('p', { class: 'notice', id: 'run-holder-gone' }, r.holder_gone) : null,
      el('div', { class: 'cards' },
        el('div', { class: 'card' }, 'Project', el('b', {}, r.project)),
        el('div', { class: 'card' }, 'Spent', el('b', { id: 'run-cost' }, dollarsMicros(total))),
        el('div', { class: 'card' }, 'Wasted', el('b', { id: 'run-wasted' }, dollarsMicros(wasted))),
        el('div', { class: 'card' }, 'Attempts', el('b', {}, attempts)),
        el('div', { class: 'card' }, 'Spot interruptions', el('b', { id: 'run-interruptions' }, interruptions)),
        el('div', { class: 'card' }, 'Created', el('b', {}, r.created_at))),
      actions(run),
      el('h2', {}, 'Stages'), drawDag(run),
      el('p', { class: 'muted' }, 'A matrix stage is one box with how many of its expansions are in each state; click it to show them. ',
        folded.map(b => el('button', { class: 'collapse', 'data-stage': b,
          onclick: () => {
            if (expanded.delete('all')) for (const o of folded) expanded.add(o);
            expanded.delete(b);
            reloadRun();
          } }, `collapse ${b}`))),
      el('h2', {}, 'Timeline'),
      legend(),
      drawTimeline(run),
      logs.panel,
      el('h2', {}, 'Attempts'),
      sortableTable('attempts', [
        { key: 'stage', label: 'Stage' }, { key: 'attempt', label: '#', num: true, fmt: v => v === null ? '' : v },
        { key: 'outcome', label: 'Outcome', fmt: v => v || 'running' },
        { key: 'instance_type', label: 'Instance' }, { key: 'market', label: 'Market' },
        { key: 'sim_hours', label: 'Sim hours', num: true, fmt: v => v.toFixed(2) },
        { key: 'cost_usd', label: 'Cost', num: true, fmt: dollars,
          id: a => a.attempt !== null && !a.outcome ? `attempt-cost-${a.stage}-${a.attempt}` : null },
        { key: 'wasted_usd', label: 'Wasted', num: true, fmt: dollars },
        { key: 'message', label: 'Why', class: 'wrap' }],
        run.stages.flatMap(s => s.matrix
          ? (s.matrix.attempts ? [{ stage: `${s.name} ×${s.matrix.count}`, attempt: null,
              outcome: Object.entries(s.matrix.outcomes).map(([k, v]) => `${v} ${k}`).join(', '),
              instance_type: s.instance_type, market: s.market, sim_hours: s.matrix.sim_hours,
              cost_usd: s.cost_usd + (s.running_cost_usd || 0), wasted_usd: s.matrix.wasted_usd,
              message: `${s.matrix.attempts} attempts of a matrix stage: click it above to list them` }] : [])
          : s.attempts.map(a => a.outcome ? { stage: s.name, ...a }
            // The running attempt: what it has cost so far, the figure the header counts, and
            // its progress (as `trnflow show --stage` prints them).
            : { stage: s.name, ...a, cost_usd: s.running_cost_usd || 0, message: progressText(s, r.speed) || a.message }))));
    // The page's width against the window's, for layout checks (tests/serve).
    main.setAttribute('data-scroll-width', document.documentElement.scrollWidth);
    main.setAttribute('data-window-width', window.innerWidth);
    logs.update(run);
  };
  // The run as the event stream last told of it (?after), matrix stages collapsed but those
  // expanded; a burst of changes is one read every half second at most.
  const load = async () => {
    const p = new URLSearchParams({ collapse: 1 });
    if (expanded.size) p.set('expand', [...expanded].join(','));
    draw(await readAfter(`/api/runs/${id}`, p, () => reload()));
  };
  const reload = throttle(load, 500);
  reloadRun = reload;
  await load();
  refresh = load;
  onChange(c => {
    if (c.run_id !== id) return;
    if (c.stage) logs.changed(c.stage);
    if (c.stage) {
      // The node changes at once; dollars and attempts follow with the next read.
      const node = document.querySelector(`#dag .node[data-stage="${CSS.escape(c.stage)}"]`);
      liveChanges.set(c.stage, (liveChanges.get(c.stage) || 0) + 1);
      if (node) {
        node.setAttribute('data-state', c.state);
        node.setAttribute('data-live-changes', liveChanges.get(c.stage));
        node.querySelector('.state-text').textContent = c.state;
      }
    }
    reload();
  });
}

async function pageSpend(main) {
  const q = new URLSearchParams(location.search);
  const base = new URLSearchParams();
  for (const k of ['project', 'pipeline', 'since', 'until']) if (q.get(k)) base.set(k, q.get(k));
  main.replaceChildren(el('h1', {}, 'Spend'),
    el('p', { class: 'muted' }, 'Closed attempts from the ledger, the figures of `trnflow spend`; running attempts join when they end.'));

  // Budgets: what each period has spent (running attempts included, as `trnflow budget ls`),
  // the running part of it, and where the month is heading (docs/serve.md: the forecast).
  const budgets = await api('/api/budgets');
  if (budgets.length > 0) {
    const bid = key => r => `budget-${r.project}-${key}`;
    main.append(el('h2', {}, 'Budgets'),
      el('p', { class: 'muted' }, 'Forecast: the period\'s end at its rate so far; the range is one standard deviation of daily spend over the days left.'),
      sortableTable('budgets', [
        { key: 'project', label: 'Project' }, { key: 'period', label: 'Period' },
        { key: 'budget_usd', label: 'Budget', num: true, fmt: dollars, id: bid('budget_usd') },
        { key: 'spent_usd', label: 'Spent', num: true, fmt: dollars, id: bid('spent_usd') },
        { key: 'committed_usd', label: 'of which running', num: true, fmt: dollars, id: bid('committed_usd') },
        { key: 'remaining_usd', label: 'Left', num: true, fmt: dollars, id: bid('remaining_usd') },
        { key: 'used', label: 'Used', num: true, sort: r => r.spent_usd / r.budget_usd,
          fmt: (v, r) => Math.round(100 * r.spent_usd / r.budget_usd) + '%' },
        { key: 'forecast_usd', label: 'Forecast', num: true, id: bid('forecast_usd'),
          fmt: (v, r) => el('span', { class: r.forecast_usd > r.budget_usd ? 'budget-over' : null }, dollars(v)) },
        { key: 'forecast_low_usd', label: 'Range', num: true, id: bid('forecast_range'),
          fmt: (v, r) => `${dollars(r.forecast_low_usd)} to ${dollars(r.forecast_high_usd)}` },
      ], budgets));
  }

  // Savings: what spot, the cache and Neuron saved (`trnflow spend --savings`).
  const savings = await api('/api/savings?' + base);
  if (savings.length > 0) {
    const keys = ['spot_cost_usd', 'spot_on_demand_usd', 'spot_saved_usd', 'cache_saved_usd', 'cost_usd', 'gpu_baseline_usd', 'gpu_saved_usd'];
    const total = { project: 'total', cache_hits: 0 };
    for (const k of keys) total[k] = 0;
    for (const r of savings) { for (const k of keys) total[k] += micros(r[k]); total.cache_hits += r.cache_hits; }
    for (const k of keys) total[k] = dollarsMicros(total[k]);
    main.append(el('h2', {}, 'Savings'),
      el('p', { class: 'muted' }, 'Spot: the on-demand price of the same billed time, less what spot cost. Cache: what the stages it served would have cost. Neuron: the same work on p4d.24xlarge GPUs, less what it cost.'),
      sortableTable('savings', [
        { key: 'project', label: 'Project' },
        { key: 'spot_cost_usd', label: 'Spot cost', num: true, fmt: dollars },
        { key: 'spot_on_demand_usd', label: 'Same on-demand', num: true, fmt: dollars },
        { key: 'spot_saved_usd', label: 'Spot saved', num: true, fmt: dollars },
        { key: 'cache_hits', label: 'Cache hits', num: true },
        { key: 'cache_saved_usd', label: 'Cache saved', num: true, fmt: dollars },
        { key: 'cost_usd', label: 'Cost', num: true, fmt: dollars },
        { key: 'gpu_baseline_usd', label: 'On GPUs (p4d)', num: true, fmt: dollars },
        { key: 'gpu_saved_usd', label: 'Neuron saved', num: true, fmt: dollars },
      ], savings, total));
  }
  const groups = [['project', 'By project'], ['pipeline', 'By pipeline'], ['instance', 'By instance'],
    ['month', 'By month'], ['day', 'By day']];
  for (const [by, title] of groups) {
    const p = new URLSearchParams(base);
    p.set('by', by);
    const rows = await api('/api/spend?' + p);
    let cost = 0, wasted = 0, saved = 0, attempts = 0;
    for (const r of rows) { cost += micros(r.cost_usd); wasted += micros(r.wasted_usd); saved += micros(r.saved_usd); attempts += r.attempts; }
    const csv = [by + ',attempts,billed_hours,cost_usd,wasted_usd,saved_usd',
      ...rows.map(r => [r[by], r.attempts, r.billed_hours, r.cost_usd, r.wasted_usd, r.saved_usd].join(','))].join('\n');
    main.append(el('h2', {}, title, ' ',
      el('a', { href: URL.createObjectURL(new Blob([csv], { type: 'text/csv' })), download: `spend-by-${by}.csv`, class: 'muted' }, 'CSV')),
      rows.length === 0 ? el('p', { class: 'muted' }, 'no spend') : sortableTable('spend-' + by, [
        { key: by, label: by },
        { key: 'attempts', label: 'Attempts', num: true },
        { key: 'billed_hours', label: 'Billed hours', num: true, fmt: v => v.toFixed(2) },
        { key: 'cost_usd', label: 'Cost', num: true, fmt: dollars },
        { key: 'wasted_usd', label: 'Wasted', num: true, fmt: dollars },
        { key: 'saved_usd', label: 'Saved', num: true, fmt: dollars },
      ], rows, { [by]: 'total', attempts, cost_usd: dollarsMicros(cost), wasted_usd: dollarsMicros(wasted), saved_usd: dollarsMicros(saved) }));
  }
}

async function pageList(main, title, path, cols) {
  const rows = await api(path);
  main.replaceChildren(el('h1', {}, title),
    rows.length === 0 ? el('p', { class: 'muted' }, 'none') : sortableTable(title.toLowerCase(), cols, rows));
}

let me = null;
async function whoami() {
  try {
    me = await api('/api/me');
    document.getElementById('who').textContent = me.role ? `as ${me.role}` : 'local';
  } catch (e) { /* the page says it */ }
}

async function route() {
  const main = document.getElementById('main');
  const path = location.pathname;
  const section = path.split('/')[1] || 'runs';
  for (const a of document.querySelectorAll('header nav a'))
    a.classList.toggle('active', a.dataset.nav === section);
  whoami();
  try {
    const m = path.match(/^\/runs\/(\d+)$/);
    if (m) await pageRun(main, m[1]);
    else if (section === 'runs') await pageRuns(main);
    else if (section === 'spend') await pageSpend(main);
    else if (section === 'cache') await pageList(main, 'Cache', '/api/cache', [
      { key: 'key', label: 'Key', fmt: v => v.slice(0, 12) }, { key: 'model', label: 'Model' },
      { key: 'shapes', label: 'Shapes' }, { key: 'target', label: 'Target' }, { key: 'state', label: 'State' },
      { key: 'project', label: 'Project' }, { key: 'bytes', label: 'Bytes', num: true },
      { key: 'hits', label: 'Hits', num: true }, { key: 'last_used_at', label: 'Last use' }]);
    else if (section === 'schedules') await pageList(main, 'Schedules', '/api/schedules', [
      { key: 'name', label: 'Name' }, { key: 'project', label: 'Project' }, { key: 'cron', label: 'Cron' },
      { key: 'tz', label: 'TZ' }, { key: 'state', label: 'State' }, { key: 'next_at', label: 'Next (UTC)' },
      { key: 'fires', label: 'Fired', num: true },
      { key: 'last_run_id', label: 'Last run', fmt: v => v ? el('a', { href: '/runs/' + v }, v) : '' }]);
    else if (section === 'workers') await pageList(main, 'Workers', '/api/workers', [
      { key: 'host', label: 'Host' }, { key: 'pid', label: 'PID', num: true }, { key: 'state', label: 'State' },
      { key: 'heartbeat_age_seconds', label: 'Heartbeat age', num: true, fmt: v => v.toFixed(1) + 's' },
      { key: 'pools', label: 'Pools (in use/capacity)', fmt: v => v.map(p => `${p.pool} ${p.in_use}/${p.capacity}`).join(' ') }]);
    else main.replaceChildren(el('p', {}, 'No such page.'));
  } catch (e) {
    showError(e);
  }
}

document.addEventListener('DOMContentLoaded', route);
