-- name: EnsureProject
INSERT INTO trnflow.projects (name) VALUES ($1) ON CONFLICT (name) DO NOTHING;

-- name: SubmitRun
-- The pipeline, the run, its stages and their needs in one call that checks, in SQL, that
-- this login may submit to the project and that the project's quotas allow it.
-- Budget admission is in it too (trnflow.admit_run, migration 0024): $22 the plan's cost
-- (NULL: unknown), $23 how many of its stages are of unknown length, $24 forced.
SELECT trnflow.submit_run($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9::numeric, $10, $11,
                          $12::text[], $13::text[], $14::text[], $15::text[], $16::int[],
                          $17::text[], $18::int[], $19::jsonb[], $20::int[], $21::int[],
                          $22::numeric, $23::int, $24::boolean);

-- name: ListRuns
-- Runs newest first: $1 project, $2 state ('' = any), $3 at most, $4 one run (0 = any),
-- $5 pipeline ('' = any), $6 created at or after this time ('' = any).
SELECT r.id, r.project, p.name, r.state, r.speed, r.seed, r.workdir,
       to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       coalesce(to_char(r.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), ''),
       trnflow.run_spent_usd(r.id)::text,
       coalesce(r.budget_usd::text, ''),
       extract(epoch FROM (coalesce(r.finished_at, now()) - r.created_at)),
       coalesce(r.cancel_reason, ''),
       coalesce((SELECT sum(a.wasted_usd) FROM trnflow.attempts a WHERE a.run_id = r.id), 0)::text
FROM trnflow.runs r JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE ($1 = '' OR r.project = $1) AND ($2 = '' OR r.state = $2)
  AND ($4::bigint = 0 OR r.id = $4::bigint)
  AND ($5 = '' OR p.name = $5)
  AND ($6 = '' OR r.created_at >= nullif($6, '')::timestamptz)
ORDER BY r.id DESC
LIMIT $3;

-- name: GetStages
-- Cost so far includes running attempts, charged for the simulated time they have run. The
-- attempts' sums are read once for the whole run (by attempts_run) and joined (a run of
-- 10,000 stages in ~60 ms; per-stage subqueries took ~400 ms). Each stage's needs are read
-- through stage_deps' key from that stage (a lateral join): a join of the run's stages to
-- stage_deps as a whole let the planner hash or merge all of stage_deps, every run's, which
-- grows with the catalog's history.
WITH a AS (
  SELECT a.stage_id,
         sum(a.cost_usd) AS cost, sum(a.billed_seconds) AS billed,
         (array_agg(a.outcome ORDER BY a.attempt DESC))[1] AS last_outcome,
         (array_agg(a.message ORDER BY a.attempt DESC))[1] AS last_message
  FROM trnflow.attempts a
  WHERE a.run_id = $1
  GROUP BY a.stage_id
), open AS (  -- the attempts running now (ledger rows are written when they close)
  SELECT a.stage_id,
         a.cost_so_far_usd AS running
  FROM trnflow.open_attempts a JOIN trnflow.runs r ON r.id = a.run_id
  WHERE a.run_id = $1
)
SELECT s.id, s.name, s.kind, s.state, s.instance_type, s.instance_count, s.market, s.attempts,
       s.progress, coalesce(a.cost, 0)::text, coalesce(a.billed, 0),
       coalesce(open.running, 0)::float8, coalesce(needs.names, ''),
       CASE WHEN s.state = 'running' THEN coalesce(s.live_progress, -1) ELSE -1 END,
       CASE WHEN s.state = 'running' THEN coalesce(s.live_sim_seconds, -1) ELSE -1 END,
       CASE WHEN s.state = 'running' THEN coalesce(s.live_eta_s, -1) ELSE -1 END,
       CASE WHEN s.state = 'running'
            THEN coalesce(extract(epoch FROM (now() - s.heartbeat_at))::float8, -1)
            ELSE -1 END,
       coalesce(a.last_outcome, ''), coalesce(a.last_message, '')
FROM trnflow.stages s
LEFT JOIN a ON a.stage_id = s.id
LEFT JOIN open ON open.stage_id = s.id
LEFT JOIN LATERAL (SELECT string_agg(n.name, ',' ORDER BY n.id) AS names
                   FROM trnflow.stage_deps d JOIN trnflow.stages n ON n.id = d.needs_id
                   WHERE d.stage_id = s.id AND n.run_id = $1) needs ON true
WHERE s.run_id = $1
ORDER BY s.id;

-- name: GetAttempts
-- A run's attempts, closed (the ledger) and open, by stage and number; with the home of the
-- worker that ran each (`logs`) and when each became ready to run (0015; '' when unknown: its
-- queue wait on the run page's timeline).
SELECT a.stage_id, a.attempt, coalesce(a.outcome, ''), a.worker_name, a.instance_type,
       a.instance_count, a.market, a.price_usd_hour::text,
       to_char(a.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       coalesce(to_char(a.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), ''),
       coalesce(a.sim_seconds, 0), coalesce(a.billed_seconds, 0),
       coalesce(a.cost_usd, 0)::text, coalesce(a.wasted_usd, 0)::text,
       coalesce(a.saved_usd, 0)::text, a.progress_from, coalesce(a.progress_to, 0),
       coalesce(a.message, ''), coalesce(w.home, ''),
       coalesce(to_char(a.queued_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), '')
FROM (SELECT stage_id, attempt, outcome, worker_name, instance_type, instance_count, market,
             price_usd_hour, started_at, finished_at, sim_seconds, billed_seconds, cost_usd,
             wasted_usd, saved_usd, progress_from, progress_to, message, worker_id, queued_at
      FROM trnflow.attempts WHERE run_id = $1
      UNION ALL
      SELECT stage_id, attempt, NULL, worker_name, instance_type, instance_count, market,
             price_usd_hour, started_at, NULL, NULL, NULL, NULL, NULL, NULL, progress_from, NULL,
             NULL, worker_id, queued_at
      FROM trnflow.open_attempts WHERE run_id = $1) a
LEFT JOIN trnflow.workers w ON w.id = a.worker_id
ORDER BY a.stage_id, a.attempt;

-- name: InsertEvent
INSERT INTO trnflow.events (run_id, stage_id, kind, message, data, project)
VALUES (NULLIF($1, 0), NULLIF($2, 0), $3, $4, $5::jsonb, NULLIF($6, ''));

-- name: EventLog
-- `trnflow events`: $1 project ('' = any), $2 run (0 = any), $3 since (timestamptz), $4 kind
-- ('' = any), $5 at most; oldest first among the newest $5.
SELECT * FROM (
  SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), kind,
         coalesce(project, ''), coalesce(run_id, 0), coalesce(stage, ''), coalesce(attempt, 0),
         message, data::text, at
  FROM trnflow.event_log
  WHERE ($1 = '' OR project = $1) AND ($2::bigint = 0 OR run_id = $2::bigint)
    AND at >= $3::timestamptz AND ($4 = '' OR kind = $4)
  ORDER BY at DESC
  LIMIT $5) newest
ORDER BY at;

-- name: InsertEvents
INSERT INTO trnflow.events (run_id, stage_id, kind, message, data)
SELECT r, NULLIF(s, 0), k, m, d
FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::jsonb[]) AS t(r, s, k, m, d);

-- name: LatestStageMetrics
SELECT DISTINCT ON (stage_id) stage_id, data::text
FROM trnflow.events
WHERE run_id = $1 AND kind = 'metrics'
ORDER BY stage_id, id DESC;

-- name: CancelRun
-- Checks, in SQL, that this login may cancel the run: (cancelled, stages ended, still running).
SELECT cancelled, stages_cancelled, stages_running FROM trnflow.cancel_run($1, $2);

-- name: CountRunningStages
SELECT count(*) FROM trnflow.running_stages WHERE run_id = $1;

-- name: ResetStages
-- Resume ($2 NULL) or retry a stage, checked in SQL against this login's projects.
SELECT trnflow.reset_stages($1, $2);

-- name: ProjectBudgets
-- Each budget with its project's spend in the current period: closed attempts from the
-- rollup (a total budget's from the counters: trnflow.closed_spend, 0025), plus running
-- attempts to their last heartbeat (trnflow.project_spent_usd, 0024 and 0025).
SELECT b.project, b.amount_usd::text, b.period, b.notified_percent,
       (b.notified_period IS NOT DISTINCT FROM ps.start) AS same_period,
       trnflow.project_spent_usd(b.project, ps.start)::numeric(18,6)::text
FROM trnflow.budgets b,
     LATERAL (SELECT trnflow.budget_period_start(b.period) AS start) ps
WHERE ($1 = '' OR b.project = $1)
ORDER BY b.project;

-- name: StageBudgetWait
-- A retry_wait stage (run $1, stage $2) that waits for its budget (migration 0033): the `budget`
-- event its wait began with, if no attempt of it closed since. Members read it (events' rows).
SELECT to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), e.data->>'needs_usd',
       e.data->>'left_usd', e.data->>'held_usd', (e.data->>'holders')::int, e.data->>'scope'
FROM trnflow.stages s
JOIN trnflow.events e ON e.run_id = s.run_id AND e.stage_id = s.id
WHERE s.run_id = $1 AND s.id = $2 AND s.state = 'retry_wait' AND e.kind = 'budget'
  AND jsonb_typeof(e.data->'needs_usd') = 'number'
  AND NOT EXISTS (SELECT 1 FROM trnflow.attempts a
                  WHERE a.run_id = s.run_id AND a.stage_id = s.id AND a.finished_at > e.at)
ORDER BY e.at DESC, e.id DESC
LIMIT 1;

-- name: RecordBudgetNotice
UPDATE trnflow.budgets
SET notified_percent = $2,
    notified_period = CASE WHEN period = 'month'
                           THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                           ELSE '-infinity'::timestamptz END
WHERE project = $1;

-- name: RunBudgets
-- Running runs with a budget_usd, what they have spent (running attempts included) and the
-- highest threshold already announced.
SELECT r.id, r.project, r.budget_usd::text, coalesce(n.percent, 0),
       trnflow.run_spent_usd(r.id)::numeric(18,6)::text
FROM trnflow.runs r
LEFT JOIN trnflow.run_budget_notices n ON n.run_id = r.id
WHERE r.state = 'running' AND r.budget_usd IS NOT NULL;

-- name: RecordRunBudgetNotice
INSERT INTO trnflow.run_budget_notices (run_id, percent) VALUES ($1, $2)
ON CONFLICT (run_id) DO UPDATE SET percent = EXCLUDED.percent;

-- name: RunningRunsOfProject
SELECT id FROM trnflow.runs WHERE project = $1 AND state = 'running' ORDER BY id;

-- name: ProjectExists
SELECT 1 FROM trnflow.projects WHERE name = $1;

-- name: RemoveBudget
DELETE FROM trnflow.budgets WHERE project = $1 RETURNING project;

-- name: UpsertBudget
INSERT INTO trnflow.budgets (project, amount_usd, period) VALUES ($1, $2::numeric, $3)
ON CONFLICT (project) DO UPDATE
SET amount_usd = EXCLUDED.amount_usd, period = EXCLUDED.period, notified_percent = 0,
    notified_period = NULL, updated_at = now();

-- name: WakeBudgetWaits
-- The stages of project $1 waiting for their budget retry at once (migration 0033): its budget
-- changed.
SELECT trnflow.wake_project_budget_waits($1);

-- name: AddProject
SELECT trnflow.add_project($1, $2::text[]);

-- name: GrantProject
SELECT trnflow.grant_project($1, $2, $3);

-- name: SetProjectQuotas
UPDATE trnflow.projects
SET max_stages_per_run = coalesce($2, max_stages_per_run),
    max_queued_stages = coalesce($3, max_queued_stages),
    job_uid = coalesce($4, job_uid)
WHERE name = $1;

-- name: StageRoom
-- The project's quotas and unfinished stages, the parser's bound before expansion (0025).
SELECT max_stages_per_run, max_queued_stages, unfinished FROM trnflow.stage_room($1);

-- name: SetJobUidRange
-- This catalog's job uid range, claimed on the server (migration 0023).
SELECT trnflow.set_job_uid_range($1, $2);

-- name: JobUidRange
SELECT coalesce((SELECT value FROM trnflow.settings WHERE key = 'job_uid_range'), '');

-- name: ListProjects
-- The people of each project: the roles granted its writer role (read and write), then those
-- granted only its read role (the writer role, a member of the read role, is not a person).
-- Roles are looked up by name in pg_roles and compared by oid: a role missing from the server
-- lists no one rather than failing the whole listing (pg_has_role with a name that does not
-- exist raises an error).
SELECT p.name, trnflow.project_role(p.name),
       coalesce((SELECT string_agg(m.rolname, ',' ORDER BY m.rolname)
                 FROM pg_roles g JOIN pg_auth_members am ON am.roleid = g.oid
                 JOIN pg_roles m ON m.oid = am.member
                 WHERE g.rolname = trnflow.project_writer_role(p.name)), ''),
       coalesce((SELECT string_agg(m.rolname, ',' ORDER BY m.rolname)
                 FROM pg_roles g JOIN pg_auth_members am ON am.roleid = g.oid
                 JOIN pg_roles m ON m.oid = am.member
                 WHERE g.rolname = trnflow.project_role(p.name)
                   AND m.rolname <> trnflow.project_writer_role(p.name)
                   AND NOT EXISTS (SELECT 1 FROM pg_roles w
                                   WHERE w.rolname = trnflow.project_writer_role(p.name)
                                     AND pg_has_role(m.oid, w.oid, 'MEMBER'))), ''),
       (SELECT count(*) FROM trnflow.runs r WHERE r.project = p.name)
FROM trnflow.projects p ORDER BY p.name;

-- name: ProjectShares
-- Each project's share of the fleet (migration 0032): weight, cap (-1: none), pool caps as
-- "pool=N,...". The owner's and the daemons' (members read project names only).
SELECT p.name, p.weight::float8, coalesce(p.max_running, -1),
       coalesce((SELECT string_agg(c.pool || '=' || c.max_running, ',' ORDER BY c.pool)
                 FROM trnflow.project_pool_caps c WHERE c.project = p.name), '')
FROM trnflow.projects p ORDER BY p.name;

-- name: SetProjectShare
-- A project's weight ($2) and cap on running stages ($3: -1 removes it), each left as it is
-- when NULL (migration 0032). No row: no such project.
UPDATE trnflow.projects
SET weight = coalesce($2::numeric, weight),
    max_running = CASE WHEN $3::int IS NULL THEN max_running WHEN $3::int < 0 THEN NULL
                       ELSE $3::int END
WHERE name = $1
RETURNING name;

-- name: SetProjectPoolCaps
-- A project's caps on running stages per pool ($2 pools, $3 caps; a cap of -1 removes it).
WITH input AS (SELECT * FROM unnest($2::text[], $3::int[]) AS t(pool, cap)),
removed AS (
  DELETE FROM trnflow.project_pool_caps c USING input i
  WHERE c.project = $1 AND c.pool = i.pool AND i.cap < 0)
INSERT INTO trnflow.project_pool_caps (project, pool, max_running)
SELECT $1, pool, cap FROM input WHERE cap >= 0
ON CONFLICT (project, pool) DO UPDATE SET max_running = EXCLUDED.max_running;

-- name: RebuildSpendRollups
-- Every spend rollup, computed from the ledger (migration 0030), for ledgers loaded in bulk
-- without the trigger that folds each inserted row.
SELECT trnflow.rebuild_spend_rollups();

-- name: RebuildMetricCounters
-- /metrics' counters, from the ledger (migration 0025), for ledgers loaded in bulk.
SELECT trnflow.rebuild_metric_counters();

-- name: CanRunStages
-- Whether this login may claim and run stages: the daemons' role (or the schema owner).
SELECT trnflow.has_role(session_user, trnflow.daemon_role())
       OR session_user = (SELECT tableowner FROM pg_tables
                          WHERE schemaname = 'trnflow' AND tablename = 'runs'),
       session_user;

-- name: RunningSpend
-- Attempts still open and what they have cost so far ($1 project, $2 pipeline; '' = any).
SELECT count(*), coalesce(sum(a.cost_so_far_usd), 0)::text
FROM trnflow.open_attempts a JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE ($1 = '' OR r.project = $1) AND ($2 = '' OR p.name = $2);
