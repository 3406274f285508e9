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

-- name: VisibleProjects
-- The projects the current role sees (row-level security decides).
SELECT name FROM trnflow.projects ORDER BY name;

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
SELECT 'trnflow_attempts_total' AS name,
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
       coalesce(sum(trnflow.running_cost_usd(a.started_at, r.speed, a.instance_count,
                                             a.price_usd_hour, a.cap_usd)), 0)::float8
FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
WHERE a.outcome IS NULL GROUP BY r.project
UNION ALL
SELECT 'trnflow_runs', jsonb_build_object('state', r.state)::text, count(*)::float8
FROM trnflow.runs r GROUP BY r.state
UNION ALL
SELECT 'trnflow_runs_finished_total', jsonb_build_object('state', r.state)::text, count(*)::float8
FROM trnflow.runs r WHERE r.finished_at IS NOT NULL GROUP BY r.state
UNION ALL
SELECT 'trnflow_stages', jsonb_build_object('pool', s.pool, 'state', s.state)::text,
       count(*)::float8
FROM trnflow.stages s WHERE s.state IN ('ready', 'running', 'retry_wait', 'blocked')
GROUP BY s.pool, s.state
UNION ALL
-- Every pool of the hardware catalog, 0 when nothing waits, so each has a series to alert on.
SELECT 'trnflow_queue_ready_stages', jsonb_build_object('pool', p.pool)::text, count(s.id)::float8
FROM (SELECT DISTINCT pool FROM trnflow.instance_types) p
LEFT JOIN trnflow.stages s ON s.pool = p.pool AND s.state = 'ready'
GROUP BY p.pool
UNION ALL
SELECT 'trnflow_queue_oldest_ready_age_seconds', jsonb_build_object('pool', p.pool)::text,
       coalesce(greatest(0, extract(epoch FROM (now() - min(s.ready_at)))), 0)::float8
FROM (SELECT DISTINCT pool FROM trnflow.instance_types) p
LEFT JOIN trnflow.stages s ON s.pool = p.pool AND s.state = 'ready'
GROUP BY p.pool
UNION ALL
SELECT 'trnflow_cache_hits_total', '{}', count(*)::float8
FROM trnflow.attempts a WHERE a.outcome = 'cached'
UNION ALL
SELECT 'trnflow_cache_misses_total', '{}', count(*)::float8
FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id
WHERE s.kind = 'compile' AND a.outcome = 'succeeded'
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
UNION ALL
-- Month-end forecast: the month's spend so far at the rate it went (linear in time). A total
-- budget's forecast is what it has spent.
SELECT 'trnflow_budget_forecast_usd',
       jsonb_build_object('project', b.project, 'period', b.period)::text,
       CASE WHEN b.period = 'month'
            THEN bs.spent::float8 * extract(epoch FROM (ps.next - ps.start))
                 / greatest(60, extract(epoch FROM (now() - ps.start)))
            ELSE bs.spent::float8 END
FROM trnflow.budgets b,
     LATERAL (SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS start,
                     (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month')
                       AT TIME ZONE 'UTC' AS next) ps,
     LATERAL (SELECT coalesce(sum(a.cost_usd), 0) AS spent
              FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id
              WHERE r.project = b.project AND a.outcome IS NOT NULL
                AND (b.period = 'total' OR a.finished_at >= ps.start)) bs
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
