-- /metrics as it was computed before migration 0024: from the ledger itself, every scrape.
-- tests/serve/serve_test.cpp (MetricsFromCountersEqualTheLedger) checks that the counters
-- give every sample this query gives. Not used by trnflow.
-- Everything /metrics exposes, one row per sample: name, labels (JSON object), value.
-- Counters are sums over the append-only ledger (closed attempts), so they only grow, across
-- restarts of anything. Labels are bounded: project, pipeline, pool, instance type, outcome,
-- state; never a run, attempt or worker id.
--
-- Histograms (`_bucket` with `le`, `_sum`, `_count`): each attempt is put in the first bucket
-- whose bound it does not exceed (one CASE per row, then a small group-by), and the buckets
-- are made cumulative over those groups, so a scrape reads the ledger once per histogram.
-- Attempt duration: wall-clock seconds from start to close of closed attempts, by pool and
-- outcome. Queue wait: seconds from the stage becoming ready (attempts.queued_at, 0015) to
-- the attempt's start, by pool, for every attempt that has started.
WITH bounds_duration(k, le) AS (
  VALUES (1, '1'), (2, '5'), (3, '15'), (4, '30'), (5, '60'), (6, '120'), (7, '300'),
         (8, '600'), (9, '1800'), (10, '3600'), (11, '7200'), (12, '21600'), (13, '86400'),
         (14, '+Inf')),
durations AS (
  SELECT pool, outcome,
         CASE WHEN v <= 1 THEN 1 WHEN v <= 5 THEN 2 WHEN v <= 15 THEN 3 WHEN v <= 30 THEN 4
              WHEN v <= 60 THEN 5 WHEN v <= 120 THEN 6 WHEN v <= 300 THEN 7 WHEN v <= 600 THEN 8
              WHEN v <= 1800 THEN 9 WHEN v <= 3600 THEN 10 WHEN v <= 7200 THEN 11
              WHEN v <= 21600 THEN 12 WHEN v <= 86400 THEN 13 ELSE 14 END AS k,
         count(*) AS n, sum(v) AS total
  FROM (SELECT s.pool, a.outcome,
               greatest(0, extract(epoch FROM (a.finished_at - a.started_at)))::float8 AS v
        FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id
        WHERE a.outcome IS NOT NULL) x
  GROUP BY 1, 2, 3),
bounds_wait(k, le) AS (
  VALUES (1, '0.5'), (2, '1'), (3, '5'), (4, '15'), (5, '30'), (6, '60'), (7, '300'),
         (8, '900'), (9, '1800'), (10, '3600'), (11, '7200'), (12, '21600'), (13, '86400'),
         (14, '+Inf')),
waits AS (
  SELECT pool,
         CASE WHEN v <= 0.5 THEN 1 WHEN v <= 1 THEN 2 WHEN v <= 5 THEN 3 WHEN v <= 15 THEN 4
              WHEN v <= 30 THEN 5 WHEN v <= 60 THEN 6 WHEN v <= 300 THEN 7 WHEN v <= 900 THEN 8
              WHEN v <= 1800 THEN 9 WHEN v <= 3600 THEN 10 WHEN v <= 7200 THEN 11
              WHEN v <= 21600 THEN 12 WHEN v <= 86400 THEN 13 ELSE 14 END AS k,
         count(*) AS n, sum(v) AS total
  FROM (SELECT s.pool, greatest(0, extract(epoch FROM (a.started_at - a.queued_at)))::float8 AS v
        FROM (SELECT stage_id, started_at, queued_at FROM trnflow.attempts
              UNION ALL
              SELECT stage_id, started_at, queued_at FROM trnflow.open_attempts) a
        JOIN trnflow.stages s ON s.id = a.stage_id
        WHERE a.queued_at IS NOT NULL) x
  GROUP BY 1, 2)
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
       jsonb_build_object('outcome', a.outcome)::text AS labels, count(*)::float8 AS value
FROM trnflow.attempts a WHERE a.outcome IS NOT NULL GROUP BY a.outcome
UNION ALL
SELECT 'trnflow_spot_interruptions_total',
       jsonb_build_object('instance_type', a.instance_type)::text, count(*)::float8
FROM trnflow.attempts a WHERE a.outcome = 'spot_interruption' GROUP BY a.instance_type
UNION ALL
SELECT 'trnflow_spend_usd_total', jsonb_build_object('project', r.project)::text,
       sum(a.cost_usd)::float8
FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
WHERE a.outcome IS NOT NULL GROUP BY r.project
UNION ALL
SELECT 'trnflow_wasted_usd_total', jsonb_build_object('project', r.project)::text,
       coalesce(sum(a.wasted_usd), 0)::float8
FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
WHERE a.outcome IS NOT NULL GROUP BY r.project
UNION ALL
SELECT 'trnflow_saved_usd_total', jsonb_build_object('project', r.project)::text,
       coalesce(sum(a.saved_usd), 0)::float8
FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
WHERE a.outcome IS NOT NULL GROUP BY r.project
UNION ALL
SELECT 'trnflow_billed_seconds_total', jsonb_build_object('instance_type', a.instance_type)::text,
       coalesce(sum(a.billed_seconds * a.instance_count), 0)::float8
FROM trnflow.attempts a WHERE a.outcome IS NOT NULL GROUP BY a.instance_type
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
SELECT 'trnflow_cache_hits_total', '{}', count(*)::float8
FROM trnflow.attempts a WHERE a.outcome = 'cached'
UNION ALL
SELECT 'trnflow_cache_misses_total', '{}', count(*)::float8
FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id
WHERE s.kind = 'compile' AND a.outcome = 'succeeded'
UNION ALL
-- Attempts a budget stopped, by project (every project with a budget has the series).
SELECT 'trnflow_budget_stops_total', jsonb_build_object('project', p.project)::text,
       (SELECT count(*) FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
        WHERE r.project = p.project AND a.outcome = 'budget_exceeded')::float8
FROM (SELECT b.project FROM trnflow.budgets b
      UNION SELECT r.project FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
      WHERE a.outcome = 'budget_exceeded') p
UNION ALL
-- Each project's queue and share of each pool, from the stages themselves.
SELECT m.name, jsonb_build_object('project', x.project, 'pool', x.pool)::text,
       CASE m.name WHEN 'trnflow_project_ready_stages' THEN x.ready
                   WHEN 'trnflow_project_running_stages' THEN x.running
                   WHEN 'trnflow_project_running_instances' THEN x.slots
                   ELSE x.oldest_s END
FROM (SELECT s.project, s.pool,
             count(*) FILTER (WHERE s.state = 'ready')::float8 AS ready,
             count(*) FILTER (WHERE s.state = 'running')::float8 AS running,
             coalesce(sum(s.instance_count) FILTER (WHERE s.state = 'running'), 0)::float8 AS slots,
             coalesce(greatest(0, extract(epoch FROM (now() - min(s.ready_at) FILTER (WHERE s.state = 'ready')))), 0)::float8 AS oldest_s
      FROM trnflow.stages s WHERE s.state IN ('ready', 'running')
      GROUP BY s.project, s.pool) x
CROSS JOIN (VALUES ('trnflow_project_ready_stages'), ('trnflow_project_running_stages'),
                   ('trnflow_project_running_instances'),
                   ('trnflow_project_oldest_ready_age_seconds')) m(name)
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
     LATERAL (SELECT coalesce(sum(a.cost_usd), 0) AS spent
              FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
              WHERE r.project = b.project AND a.outcome IS NOT NULL
                AND a.finished_at >= ps.start) bs
-- The month-end forecast and its band come from BudgetForecasts (below), added by the dashboard.
UNION ALL
SELECT 'trnflow_workers', jsonb_build_object('state', CASE WHEN w.heartbeat_at > now() - interval '60 seconds'
                                                          THEN 'live' ELSE 'stale' END)::text,
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
WHERE w.stopped_at IS NULL AND w.heartbeat_at > now() - interval '60 seconds'
GROUP BY p.key
UNION ALL
SELECT 'trnflow_schedules', jsonb_build_object('state', CASE WHEN s.paused THEN 'paused' ELSE 'active' END)::text,
       count(*)::float8
FROM trnflow.schedules s GROUP BY 2
UNION ALL
SELECT 'trnflow_schedule_fires_total', '{}', count(*)::float8
FROM trnflow.schedule_fires f;

