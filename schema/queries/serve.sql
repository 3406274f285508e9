-- name: MemberProjects
-- The projects role $1 may read, when the dashboard may act as it: a login role that is not
-- privileged, not the daemons' or the reader's, and a member of some project; else no rows.
SELECT p.name
FROM trnflow.projects p, pg_roles m
WHERE m.rolname = $1 AND m.rolcanlogin
  AND NOT (m.rolsuper OR m.rolcreaterole OR m.rolbypassrls)
  AND m.rolname <> trnflow.daemon_role() AND m.rolname <> trnflow.reader_role()
  AND trnflow.has_role(m.rolname, trnflow.project_role(p.name))
ORDER BY p.name;

-- name: MayWrite
-- Whether role $1 may submit, cancel, retry and resume in project $2 (its writer role).
SELECT trnflow.has_role($1, trnflow.project_writer_role($2));

-- name: ActAs
-- Session-level: the connection acts as role $1 until ActAs('none') resets it.
SELECT set_config('role', $1, false);

-- name: ChangesSince
-- State changes after id $1, oldest first, at most $2.
SELECT c.id, to_char(c.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), c.project,
       c.run_id, coalesce(c.stage, ''), c.state
FROM trnflow.changes c
WHERE c.id > $1
ORDER BY c.id
LIMIT $2;

-- name: PruneChanges
-- Changes older than $1 seconds: a stream resumes from minutes ago, never from last week.
DELETE FROM trnflow.changes WHERE at < now() - make_interval(secs => $1);

-- name: LatestChangeId
SELECT coalesce(max(id), 0) FROM trnflow.changes;

-- name: Metrics
-- Everything /metrics exposes, one row per sample: name, labels (JSON object), value.
-- Counters are sums over the append-only ledger (closed attempts), so they only grow, across
-- restarts of anything. Labels are bounded: project, pipeline, pool, instance type, outcome,
-- state; never a run, attempt or worker id.
--
-- Nothing here reads the ledger: closed attempts are counted as they are inserted (migration
-- 0025: attempt_counts, attempt_duration_buckets, attempt_wait_buckets, spend_by_close_month),
-- so a scrape sums rows per project, pool, instance type and outcome, however long the history.
--
-- Histograms (`_bucket` with `le`, `_sum`, `_count`): each attempt is in the first bucket whose
-- bound it does not exceed (trnflow.duration_bucket / wait_bucket), and the buckets are made
-- cumulative here. Attempt duration: wall-clock seconds from start to close of closed attempts,
-- by pool and outcome. Queue wait: seconds from the stage becoming ready (attempts.queued_at,
-- 0015) to the attempt's start, by pool, for every attempt that has started: the closed ones
-- from their buckets, the running ones from open_attempts.
WITH bounds_duration(k, le) AS (
  VALUES (1, '1'), (2, '5'), (3, '15'), (4, '30'), (5, '60'), (6, '120'), (7, '300'),
         (8, '600'), (9, '1800'), (10, '3600'), (11, '7200'), (12, '21600'), (13, '86400'),
         (14, '+Inf')),
durations AS (
  SELECT pool, outcome, k, sum(attempts) AS n, sum(seconds) AS total
  FROM trnflow.attempt_duration_buckets
  GROUP BY 1, 2, 3),
bounds_wait(k, le) AS (
  VALUES (1, '0.5'), (2, '1'), (3, '5'), (4, '15'), (5, '30'), (6, '60'), (7, '300'),
         (8, '900'), (9, '1800'), (10, '3600'), (11, '7200'), (12, '21600'), (13, '86400'),
         (14, '+Inf')),
waits AS (
  SELECT pool, k, sum(n) AS n, sum(total) AS total
  FROM (SELECT pool, k, attempts AS n, seconds AS total FROM trnflow.attempt_wait_buckets
        UNION ALL
        SELECT s.pool, trnflow.wait_bucket(x.v), 1, x.v::numeric
        FROM (SELECT stage_id,
                     greatest(0, extract(epoch FROM (started_at - queued_at)))::float8 AS v
              FROM trnflow.open_attempts WHERE queued_at IS NOT NULL) x
        JOIN trnflow.stages s ON s.id = x.stage_id) u
  GROUP BY 1, 2),
counts AS (
  SELECT project, instance_type, kind, outcome, sum(attempts) AS attempts,
         sum(cost_usd) AS cost_usd, sum(wasted_usd) AS wasted_usd, sum(saved_usd) AS saved_usd,
         sum(instance_seconds) AS instance_seconds
  FROM trnflow.attempt_counts
  GROUP BY 1, 2, 3, 4)
SELECT 'trnflow_attempt_duration_seconds_bucket' AS name,
       jsonb_build_object('pool', g.pool, 'outcome', g.outcome, 'le', b.le)::text AS labels,
       (SELECT coalesce(sum(d.n), 0) FROM durations d
        WHERE d.pool = g.pool AND d.outcome = g.outcome AND d.k <= b.k)::float8 AS value
FROM (SELECT DISTINCT pool, outcome FROM durations) g CROSS JOIN bounds_duration b
UNION ALL
SELECT 'trnflow_attempt_duration_seconds_sum',
       jsonb_build_object('pool', pool, 'outcome', outcome)::text, sum(total)::float8
FROM durations GROUP BY pool, outcome
UNION ALL
SELECT 'trnflow_attempt_duration_seconds_count',
       jsonb_build_object('pool', pool, 'outcome', outcome)::text, sum(n)::float8
FROM durations GROUP BY pool, outcome
UNION ALL
SELECT 'trnflow_queue_wait_seconds_bucket',
       jsonb_build_object('pool', g.pool, 'le', b.le)::text,
       (SELECT coalesce(sum(w.n), 0) FROM waits w WHERE w.pool = g.pool AND w.k <= b.k)::float8
FROM (SELECT DISTINCT pool FROM waits) g CROSS JOIN bounds_wait b
UNION ALL
SELECT 'trnflow_queue_wait_seconds_sum', jsonb_build_object('pool', pool)::text,
       sum(total)::float8
FROM waits GROUP BY pool
UNION ALL
SELECT 'trnflow_queue_wait_seconds_count', jsonb_build_object('pool', pool)::text,
       sum(n)::float8
FROM waits GROUP BY pool
UNION ALL
SELECT 'trnflow_attempts_total',
       jsonb_build_object('outcome', c.outcome)::text AS labels, sum(c.attempts)::float8 AS value
FROM counts c GROUP BY c.outcome
UNION ALL
SELECT 'trnflow_spot_interruptions_total',
       jsonb_build_object('instance_type', c.instance_type)::text, sum(c.attempts)::float8
FROM counts c WHERE c.outcome = 'spot_interruption' GROUP BY c.instance_type
UNION ALL
SELECT 'trnflow_spend_usd_total', jsonb_build_object('project', c.project)::text,
       sum(c.cost_usd)::float8
FROM counts c GROUP BY c.project
UNION ALL
SELECT 'trnflow_wasted_usd_total', jsonb_build_object('project', c.project)::text,
       coalesce(sum(c.wasted_usd), 0)::float8
FROM counts c GROUP BY c.project
UNION ALL
SELECT 'trnflow_saved_usd_total', jsonb_build_object('project', c.project)::text,
       coalesce(sum(c.saved_usd), 0)::float8
FROM counts c GROUP BY c.project
UNION ALL
SELECT 'trnflow_billed_seconds_total', jsonb_build_object('instance_type', c.instance_type)::text,
       coalesce(sum(c.instance_seconds), 0)::float8
FROM counts c GROUP BY c.instance_type
UNION ALL
SELECT 'trnflow_running_spend_usd', jsonb_build_object('project', r.project)::text,
       coalesce(sum(a.cost_so_far_usd), 0)::float8
FROM trnflow.open_attempts a JOIN trnflow.runs r ON r.id = a.run_id
GROUP BY r.project
UNION ALL
SELECT 'trnflow_runs', jsonb_build_object('state', r.state)::text, count(*)::float8
FROM trnflow.runs r GROUP BY r.state
UNION ALL
SELECT 'trnflow_runs_finished_total', jsonb_build_object('state', r.state)::text, count(*)::float8
FROM trnflow.runs r WHERE r.finished_at IS NOT NULL GROUP BY r.state
UNION ALL
-- Unfinished stages by pool and state: ready ones from the queue, running ones from
-- running_stages, the others from the stages that wait (migration 0022's index).
SELECT 'trnflow_stages', jsonb_build_object('pool', u.pool, 'state', u.state)::text,
       count(*)::float8
FROM (SELECT q.pool, 'ready' AS state FROM trnflow.ready_stages q
      UNION ALL
      SELECT s.pool, s.state FROM trnflow.running_stages q JOIN trnflow.stages s ON s.id = q.stage_id
      UNION ALL
      SELECT s.pool, s.state FROM trnflow.stages s
      WHERE (s.pending_needs > 0 OR s.retry_at IS NOT NULL)
        AND s.state IN ('retry_wait', 'blocked')) u
GROUP BY u.pool, u.state
UNION ALL
-- Every pool of the hardware catalog, 0 when nothing waits, so each has a series to alert on.
SELECT 'trnflow_queue_ready_stages', jsonb_build_object('pool', p.pool)::text,
       count(q.stage_id)::float8
FROM (SELECT DISTINCT pool FROM trnflow.instance_types) p
LEFT JOIN trnflow.ready_stages q ON q.pool = p.pool
GROUP BY p.pool
UNION ALL
SELECT 'trnflow_queue_oldest_ready_age_seconds', jsonb_build_object('pool', p.pool)::text,
       coalesce(greatest(0, extract(epoch FROM (now() - min(q.ready_at)))), 0)::float8
FROM (SELECT DISTINCT pool FROM trnflow.instance_types) p
LEFT JOIN trnflow.ready_stages q ON q.pool = p.pool
GROUP BY p.pool
UNION ALL
-- By project and pool (migration 0032): who waits, who runs and what share each holds, so a
-- starved project shows. Every pair with a stage ready or running has each series (0 for the
-- side it has none of).
SELECT m.name, jsonb_build_object('project', pp.project, 'pool', pp.pool)::text,
       CASE m.name WHEN 'trnflow_project_ready_stages' THEN pp.ready
                   WHEN 'trnflow_project_running_stages' THEN pp.running
                   WHEN 'trnflow_project_running_instances' THEN pp.slots
                   ELSE pp.oldest_s END
FROM (SELECT project, pool, sum(ready)::float8 AS ready, sum(running)::float8 AS running,
             sum(slots)::float8 AS slots, max(oldest_s)::float8 AS oldest_s
      FROM (SELECT q.project, q.pool, count(*) AS ready, 0 AS running, 0 AS slots,
                   greatest(0, extract(epoch FROM (now() - min(q.ready_at)))) AS oldest_s
            FROM trnflow.ready_stages q GROUP BY q.project, q.pool
            UNION ALL
            SELECT r.project, r.pool, 0, count(*), sum(r.slots), 0
            FROM trnflow.running_stages r GROUP BY r.project, r.pool) u
      GROUP BY project, pool) pp
CROSS JOIN (VALUES ('trnflow_project_ready_stages'), ('trnflow_project_running_stages'),
                   ('trnflow_project_running_instances'),
                   ('trnflow_project_oldest_ready_age_seconds')) m(name)
UNION ALL
SELECT 'trnflow_cache_hits_total', '{}', coalesce(sum(c.attempts), 0)::float8
FROM counts c WHERE c.outcome = 'cached'
UNION ALL
SELECT 'trnflow_cache_misses_total', '{}', coalesce(sum(c.attempts), 0)::float8
FROM counts c WHERE c.kind = 'compile' AND c.outcome = 'succeeded'
UNION ALL
SELECT 'trnflow_budget_usd', jsonb_build_object('project', b.project, 'period', b.period)::text,
       b.amount_usd::float8
FROM trnflow.budgets b
UNION ALL
SELECT 'trnflow_budget_spent_usd',
       jsonb_build_object('project', b.project, 'period', b.period)::text, bs.spent::float8
FROM trnflow.budgets b,
     LATERAL (SELECT CASE WHEN b.period = 'month'
                          THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                          ELSE '-infinity'::timestamptz END AS start) ps,
     LATERAL (SELECT coalesce(sum(m.cost_usd), 0) AS spent
              FROM trnflow.spend_by_close_month m
              WHERE m.project = b.project
                AND m.month >= (ps.start AT TIME ZONE 'UTC')::date) bs
UNION ALL
-- Attempts a budget stopped (budget_exceeded: at their spend cap, or when the budget guard
-- stopped their run), by project; 0 for every project with a budget, so the first stop is an
-- increase an alert sees.
SELECT 'trnflow_budget_stops_total', jsonb_build_object('project', p.project)::text,
       coalesce(sum(c.attempts), 0)::float8
FROM (SELECT b.project FROM trnflow.budgets b
      UNION SELECT c.project FROM counts c WHERE c.outcome = 'budget_exceeded') p
LEFT JOIN counts c ON c.project = p.project AND c.outcome = 'budget_exceeded'
GROUP BY p.project
-- The month-end forecast and its band come from BudgetForecasts (below), added by the dashboard.
UNION ALL
SELECT 'trnflow_workers', jsonb_build_object('state', CASE WHEN w.heartbeat_at >= now() - make_interval(secs => coalesce(w.lease_s, 15))
                                                          THEN 'live' ELSE 'dead' END)::text,
       count(*)::float8
FROM trnflow.workers w WHERE w.stopped_at IS NULL AND w.heartbeat_at > now() - interval '1 day'
GROUP BY 2
UNION ALL
SELECT 'trnflow_worker_heartbeat_age_seconds_max', '{}',
       coalesce(max(extract(epoch FROM (now() - w.heartbeat_at))), 0)::float8
FROM trnflow.workers w WHERE w.stopped_at IS NULL AND w.heartbeat_at > now() - interval '1 day'
UNION ALL
SELECT 'trnflow_pool_capacity_instances', jsonb_build_object('pool', p.key)::text,
       sum(p.value::text::float8)
FROM trnflow.workers w, jsonb_each(w.pools) p
WHERE w.stopped_at IS NULL
  AND w.heartbeat_at >= now() - make_interval(secs => coalesce(w.lease_s, 15))
GROUP BY p.key
UNION ALL
SELECT 'trnflow_schedules', jsonb_build_object('state', CASE WHEN s.paused THEN 'paused' ELSE 'active' END)::text,
       count(*)::float8
FROM trnflow.schedules s GROUP BY 2
UNION ALL
SELECT 'trnflow_schedule_fires_total', '{}', count(*)::float8
FROM trnflow.schedule_fires f;

-- name: BudgetForecasts
-- Each budget this role sees: what its period has spent (closed attempts from the rollup plus
-- open attempts so far, the figure of `trnflow budget ls`), the open attempts' part of it
-- (committed), and a month-end forecast with a band (docs/serve.md, "Budgets and forecast"):
--   forecast = spent x (seconds in the month) / (seconds of it gone by, at least 60): linear;
--   band     = forecast -/+ sd x sqrt(days left), sd the population standard deviation of the
--              closed spend of each UTC day of the month so far (days without spend count 0):
--              the spread of a sum of that many days like the ones so far; the low end is never
--              under what is spent already. A `total` budget's forecast is what it has spent.
SELECT b.project, b.period, b.amount_usd::text, (m.closed + m.committed)::numeric(18,6)::text,
       m.committed::numeric(18,6)::text, f.forecast::numeric(18,6)::text,
       greatest(m.closed + m.committed, f.forecast - f.band)::numeric(18,6)::text,
       (f.forecast + f.band)::numeric(18,6)::text
FROM trnflow.budgets b,
     LATERAL (SELECT CASE WHEN b.period = 'month'
                          THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                          ELSE '-infinity'::timestamptz END AS start,
                     (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month')
                       AT TIME ZONE 'UTC' AS next) ps,
     -- OFFSET 0: computed once per budget, not once per expression that uses it.
     LATERAL (SELECT trnflow.closed_spend(b.project, ps.start) AS closed,
                     coalesce((SELECT sum(a.cost_so_far_usd)
                               FROM trnflow.open_attempts a
                               JOIN trnflow.runs r ON r.id = a.run_id
                               WHERE r.project = b.project), 0)
                       AS committed OFFSET 0) m,
     LATERAL (SELECT coalesce(stddev_pop(coalesce(d.cost, 0)), 0) AS sd
              FROM generate_series(date_trunc('month', now() AT TIME ZONE 'UTC'),
                                   date_trunc('day', now() AT TIME ZONE 'UTC'),
                                   interval '1 day') g(day)
              LEFT JOIN (SELECT day, sum(cost_usd) AS cost FROM trnflow.spend_day
                         WHERE project = b.project
                           AND day >= (date_trunc('month', now() AT TIME ZONE 'UTC'))::date
                         GROUP BY day) d ON d.day = g.day::date) sp,
     LATERAL (SELECT CASE WHEN b.period = 'month'
                          THEN (m.closed + m.committed) * extract(epoch FROM (ps.next - ps.start))
                               / greatest(60, extract(epoch FROM (now() - ps.start)))
                          ELSE m.closed + m.committed END AS forecast,
                     CASE WHEN b.period = 'month'
                          THEN sp.sd * sqrt(greatest(0, extract(epoch FROM (ps.next - now())))
                                            / 86400)
                          ELSE 0 END AS band) f
ORDER BY b.project;

-- name: Savings
-- What was saved, by project, over closed attempts started on days $3..$4 ('': open-ended)
-- of project $1 and pipeline $2 ('' = any), from the rollup `trnflow spend` reads: spot
-- (the billed time at the on-demand price, less what spot cost), the cache (what the stages
-- it served would have cost; the ledger's saved_usd) and the GPU baseline (the same work on
-- p4d.24xlarge, less what it cost on Neuron). Cache hits are counted in the ledger itself.
SELECT x.project, x.spot_cost::text, x.spot_on_demand::text, (x.spot_on_demand - x.spot_cost)::text,
       coalesce(h.hits, 0), x.cache_saved::text, x.cost::text, x.baseline::text,
       (x.baseline - x.cost)::text
FROM (SELECT ro.project,
             coalesce(sum(ro.cost_usd) FILTER (WHERE ro.market = 'spot'), 0) AS spot_cost,
             coalesce(sum(ro.on_demand_usd) FILTER (WHERE ro.market = 'spot'), 0) AS spot_on_demand,
             sum(ro.saved_usd) AS cache_saved, sum(ro.cost_usd) AS cost,
             sum(ro.baseline_usd) AS baseline
      FROM trnflow.spend_rollup ro
      WHERE ($1 = '' OR ro.project = $1) AND ($2 = '' OR ro.pipeline = $2)
        AND ($3 = '' OR ro.day >= $3::date) AND ($4 = '' OR ro.day <= $4::date)
      GROUP BY ro.project) x
LEFT JOIN (SELECT r.project, count(*) AS hits
           FROM trnflow.attempts a
           JOIN trnflow.runs r ON r.id = a.run_id
           JOIN trnflow.pipelines p ON p.id = r.pipeline_id
           WHERE a.outcome = 'cached' AND ($1 = '' OR r.project = $1) AND ($2 = '' OR p.name = $2)
             AND ($3 = '' OR (a.started_at AT TIME ZONE 'UTC')::date >= $3::date)
             AND ($4 = '' OR (a.started_at AT TIME ZONE 'UTC')::date <= $4::date)
           GROUP BY r.project) h ON h.project = x.project
ORDER BY x.project;

-- name: SavingsByMonth
-- Savings as above over whole months ($3 the first day of one or '', $4 the last day of one or
-- ''), from spend_month (0030), which counts cache hits too: rows per project, month, pipeline,
-- kind, instance type and market, whatever the ledger's length.
SELECT project, coalesce(sum(cost_usd) FILTER (WHERE market = 'spot'), 0)::text,
       coalesce(sum(on_demand_usd) FILTER (WHERE market = 'spot'), 0)::text,
       (coalesce(sum(on_demand_usd) FILTER (WHERE market = 'spot'), 0)
        - coalesce(sum(cost_usd) FILTER (WHERE market = 'spot'), 0))::text,
       sum(cached), sum(saved_usd)::text, sum(cost_usd)::text, sum(baseline_usd)::text,
       (sum(baseline_usd) - sum(cost_usd))::text
FROM trnflow.spend_month
WHERE ($1 = '' OR project = $1) AND ($2 = '' OR pipeline = $2)
  AND ($3 = '' OR month >= $3::date) AND ($4 = '' OR month <= $4::date)
GROUP BY project
ORDER BY project;

-- name: OldestRunningTransaction
-- The event hub's clock for holes in trnflow.changes (serve/event_hub.cpp): the oldest
-- transaction still running.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint;

-- name: NewTransactionId
-- A transaction id above every one given out so far (this transaction's own). The snapshot's
-- xmax is not: it is one past the newest transaction that *ended*.
SELECT pg_current_xact_id()::text::bigint;

-- name: IssueLogTicket
-- A one-use ticket for the log of attempt $3 (null: the latest) of stage $2 of run $1, for
-- this login (migration 0028; trnflow.log_ticket checks who asks).
SELECT ticket, attempt FROM trnflow.log_ticket($1, $2, $3);

-- name: SpendLogTicket
-- The member, run, stage and attempt of ticket $1, once (the daemons' login only).
SELECT member, run_id, stage, attempt FROM trnflow.spend_log_ticket($1);
