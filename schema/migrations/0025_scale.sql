-- 0025: the stage bound the parser applies before it expands a matrix.
--
-- Stage counts multiply before anything is expanded (matrix products × aliases), so a 1.9 KB
-- file could name a million stages and cost gigabytes before submit_run's quota refused it.
-- The parser now counts the stages first and refuses past the project's room, which it reads
-- here: the same quotas and the same count of unfinished stages submit_run_0022 checks (that
-- check stays, under the project's row lock, for the submit that races another).
-- A project that does not exist yet has the column defaults; a login that may not write to the
-- project learns only its per-run quota (its submit is refused for permission anyway).
CREATE FUNCTION trnflow.stage_room(p_project text, OUT max_stages_per_run int,
  OUT max_queued_stages int, OUT unfinished bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(p.max_stages_per_run, 250000), coalesce(p.max_queued_stages, 1000000),
         CASE WHEN p.name IS NULL OR NOT trnflow.may_write(p_project) THEN 0
         ELSE (SELECT count(*) FROM trnflow.ready_stages WHERE project = p_project)
            + (SELECT count(*) FROM trnflow.running_stages WHERE project = p_project)
            + (SELECT count(*) FROM trnflow.runs r JOIN trnflow.stages s ON s.run_id = r.id
               WHERE r.project = p_project AND r.state = 'running'
                 AND (s.pending_needs > 0 OR s.retry_at IS NOT NULL))
         END
  FROM (SELECT 1) one LEFT JOIN trnflow.projects p ON p.name = p_project
$$;

-- /metrics from counters, not from the ledger. A scrape read the whole ledger about eight times
-- (histograms, cache counters, the month's budget spend): 0.52 s at 100k attempts, growing with
-- history. Now each closed attempt is folded into small counter tables as it is inserted (a
-- statement trigger, as the spend rollup is kept), and the Metrics query sums those: its cost
-- grows with projects, pools, instance types and outcomes, never with attempts.
--
-- Each counter row is keyed by a shard (the inserting backend's pid mod 8) as well, so workers
-- completing attempts of one project at once do not all wait on one row's lock until commit;
-- a scrape sums the shards. Sums of money and seconds are numeric: exact, whatever the order
-- attempts arrive in.
CREATE FUNCTION trnflow.duration_bucket(v float8) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (CASE WHEN v <= 1 THEN 1 WHEN v <= 5 THEN 2 WHEN v <= 15 THEN 3 WHEN v <= 30 THEN 4
               WHEN v <= 60 THEN 5 WHEN v <= 120 THEN 6 WHEN v <= 300 THEN 7 WHEN v <= 600 THEN 8
               WHEN v <= 1800 THEN 9 WHEN v <= 3600 THEN 10 WHEN v <= 7200 THEN 11
               WHEN v <= 21600 THEN 12 WHEN v <= 86400 THEN 13 ELSE 14 END)::smallint
$$;
CREATE FUNCTION trnflow.wait_bucket(v float8) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (CASE WHEN v <= 0.5 THEN 1 WHEN v <= 1 THEN 2 WHEN v <= 5 THEN 3 WHEN v <= 15 THEN 4
               WHEN v <= 30 THEN 5 WHEN v <= 60 THEN 6 WHEN v <= 300 THEN 7 WHEN v <= 900 THEN 8
               WHEN v <= 1800 THEN 9 WHEN v <= 3600 THEN 10 WHEN v <= 7200 THEN 11
               WHEN v <= 21600 THEN 12 WHEN v <= 86400 THEN 13 ELSE 14 END)::smallint
$$;

-- Closed attempts by what the counters are labelled with.
CREATE TABLE trnflow.attempt_counts (
  project          text NOT NULL,
  pool             text NOT NULL,
  instance_type    text NOT NULL,
  kind             text NOT NULL,
  outcome          text NOT NULL,
  shard            smallint NOT NULL,
  attempts         bigint NOT NULL,
  cost_usd         numeric NOT NULL,
  wasted_usd       numeric NOT NULL,
  saved_usd        numeric NOT NULL,
  instance_seconds numeric NOT NULL,  -- billed seconds x instances
  PRIMARY KEY (project, pool, instance_type, kind, outcome, shard)
);
-- Closed attempts' wall-clock seconds from start to close, by histogram bucket (`k`, the
-- bucket's index in the Metrics query's bounds: the first whose bound the value does not pass).
CREATE TABLE trnflow.attempt_duration_buckets (
  project  text NOT NULL,
  pool     text NOT NULL,
  outcome  text NOT NULL,
  k        smallint NOT NULL,
  shard    smallint NOT NULL,
  attempts bigint NOT NULL,
  seconds  numeric NOT NULL,
  PRIMARY KEY (project, pool, outcome, k, shard)
);
-- Closed attempts' seconds from ready to start. Attempts still running are added at the scrape
-- from open_attempts (as many as run now, not as many as ever ran).
CREATE TABLE trnflow.attempt_wait_buckets (
  project  text NOT NULL,
  pool     text NOT NULL,
  k        smallint NOT NULL,
  shard    smallint NOT NULL,
  attempts bigint NOT NULL,
  seconds  numeric NOT NULL,
  PRIMARY KEY (project, pool, k, shard)
);
-- Closed spend by the UTC month the attempt closed in: a budget's spend this month.
CREATE TABLE trnflow.spend_by_close_month (
  project  text NOT NULL,
  month    date NOT NULL,
  shard    smallint NOT NULL,
  cost_usd numeric NOT NULL,
  PRIMARY KEY (project, month, shard)
);

CREATE FUNCTION trnflow.count_closed_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE sh smallint := (pg_backend_pid() % 8)::smallint;
BEGIN
  WITH n AS MATERIALIZED (
    SELECT s.project, s.pool, s.kind, a.instance_type, a.outcome, a.cost_usd, a.wasted_usd,
           a.saved_usd, a.billed_seconds * a.instance_count AS instance_seconds,
           greatest(0, extract(epoch FROM (a.finished_at - a.started_at)))::float8 AS duration,
           CASE WHEN a.queued_at IS NOT NULL
                THEN greatest(0, extract(epoch FROM (a.started_at - a.queued_at)))::float8 END AS wait,
           (date_trunc('month', a.finished_at AT TIME ZONE 'UTC'))::date AS month
    FROM new_rows a JOIN trnflow.stages s ON s.id = a.stage_id),
  c AS (
    INSERT INTO trnflow.attempt_counts AS t
    SELECT project, pool, instance_type, kind, outcome, sh, count(*), coalesce(sum(cost_usd), 0),
           coalesce(sum(wasted_usd), 0), coalesce(sum(saved_usd), 0),
           coalesce(sum(instance_seconds), 0)
    FROM n GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (project, pool, instance_type, kind, outcome, shard) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts, cost_usd = t.cost_usd + EXCLUDED.cost_usd,
        wasted_usd = t.wasted_usd + EXCLUDED.wasted_usd,
        saved_usd = t.saved_usd + EXCLUDED.saved_usd,
        instance_seconds = t.instance_seconds + EXCLUDED.instance_seconds),
  d AS (
    INSERT INTO trnflow.attempt_duration_buckets AS t
    SELECT project, pool, outcome, trnflow.duration_bucket(duration), sh, count(*),
           coalesce(sum(duration::numeric), 0)
    FROM n GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    ON CONFLICT (project, pool, outcome, k, shard) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts, seconds = t.seconds + EXCLUDED.seconds),
  w AS (
    INSERT INTO trnflow.attempt_wait_buckets AS t
    SELECT project, pool, trnflow.wait_bucket(wait), sh, count(*), coalesce(sum(wait::numeric), 0)
    FROM n WHERE wait IS NOT NULL GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (project, pool, k, shard) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts, seconds = t.seconds + EXCLUDED.seconds)
  INSERT INTO trnflow.spend_by_close_month AS t
  SELECT project, month, sh, coalesce(sum(cost_usd), 0)
  FROM n GROUP BY 1, 2 ORDER BY 1, 2
  ON CONFLICT (project, month, shard) DO UPDATE SET cost_usd = t.cost_usd + EXCLUDED.cost_usd;
  RETURN NULL;
END $$;
CREATE TRIGGER attempts_count_metrics AFTER INSERT ON trnflow.attempts
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.count_closed_attempts();

-- The ledger so far, folded once (shard 0); also for ledgers loaded in bulk with the trigger
-- off (Catalog::RebuildSpendRollup calls it). Owner only.
CREATE FUNCTION trnflow.rebuild_metric_counters() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  TRUNCATE trnflow.attempt_counts, trnflow.attempt_duration_buckets, trnflow.attempt_wait_buckets,
           trnflow.spend_by_close_month;
  INSERT INTO trnflow.attempt_counts
  SELECT s.project, s.pool, a.instance_type, s.kind, a.outcome, 0, count(*),
         coalesce(sum(a.cost_usd), 0), coalesce(sum(a.wasted_usd), 0),
         coalesce(sum(a.saved_usd), 0), coalesce(sum(a.billed_seconds * a.instance_count), 0)
  FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id
  GROUP BY 1, 2, 3, 4, 5;
  INSERT INTO trnflow.attempt_duration_buckets
  SELECT project, pool, outcome, trnflow.duration_bucket(v), 0, count(*),
         coalesce(sum(v::numeric), 0)
  FROM (SELECT s.project, s.pool, a.outcome,
               greatest(0, extract(epoch FROM (a.finished_at - a.started_at)))::float8 AS v
        FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id) x
  GROUP BY 1, 2, 3, 4;
  INSERT INTO trnflow.attempt_wait_buckets
  SELECT project, pool, trnflow.wait_bucket(v), 0, count(*), coalesce(sum(v::numeric), 0)
  FROM (SELECT s.project, s.pool,
               greatest(0, extract(epoch FROM (a.started_at - a.queued_at)))::float8 AS v
        FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id
        WHERE a.queued_at IS NOT NULL) x
  GROUP BY 1, 2, 3;
  INSERT INTO trnflow.spend_by_close_month
  SELECT s.project, (date_trunc('month', a.finished_at AT TIME ZONE 'UTC'))::date, 0,
         coalesce(sum(a.cost_usd), 0)
  FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id
  GROUP BY 1, 2;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.rebuild_metric_counters() FROM PUBLIC;
SELECT trnflow.rebuild_metric_counters();

-- Who reads them: whoever reads the project's attempts (members, the reader, the daemons).
DO $$
DECLARE
  t text;
  d text := trnflow.daemon_role();
  p text;
BEGIN
  FOREACH t IN ARRAY ARRAY['attempt_counts', 'attempt_duration_buckets', 'attempt_wait_buckets',
                           'spend_by_close_month'] LOOP
    EXECUTE format('ALTER TABLE trnflow.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('CREATE POLICY visible ON trnflow.%I FOR SELECT USING (trnflow.can_see_project(project))', t);
    EXECUTE format('CREATE POLICY daemon_all ON trnflow.%I TO %I USING (true) WITH CHECK (true)', t, d);
    EXECUTE format('GRANT SELECT ON trnflow.%I TO %I', t, d);
    EXECUTE format('GRANT SELECT ON trnflow.%I TO %I', t, trnflow.reader_role());
  END LOOP;
END $$;
ALTER FUNCTION trnflow.ensure_project(text) RENAME TO ensure_project_0024;
CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0024(p);
  EXECUTE format('GRANT SELECT ON trnflow.attempt_counts, trnflow.attempt_duration_buckets,
                  trnflow.attempt_wait_buckets, trnflow.spend_by_close_month TO %I',
                 trnflow.project_role(p));
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.ensure_project(text) FROM PUBLIC;
DO $$
DECLARE p text;
BEGIN
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- A budget's closed spend since `start` (its period's first instant; '-infinity' for a `total`
-- budget): a month's from the rollup's rows of this month, a total from the counters above, so
-- neither reads more rows as history grows (a total budget summed every rollup row of its
-- project). The same figures: both are the sums of the closed attempts' cost. Invoker's rights:
-- row-level security decides what a member sums, as before.
CREATE FUNCTION trnflow.closed_spend(p text, start timestamptz) RETURNS numeric
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(CASE WHEN start = '-infinity'
                       THEN (SELECT sum(cost_usd) FROM trnflow.attempt_counts WHERE project = p)
                       ELSE (SELECT sum(cost_usd) FROM trnflow.spend_rollup
                             WHERE project = p AND day >= start::date) END, 0)
$$;

-- A project's newest runs (`trnflow runs --project`, /api/runs?project=): by index, newest
-- first, instead of walking every run's id backwards until enough of the project's are found
-- (runs_project_created orders by created_at; the list orders by id).
CREATE INDEX runs_project_id ON trnflow.runs (project, id DESC);

-- A project's spend in a budget period (0024_money_under_faults) takes its closed part from closed_spend: a total
-- budget from the counters, not every rollup row of the project (admission, `budget ls`, the
-- budget guard).
CREATE OR REPLACE FUNCTION trnflow.project_spent_usd(p_project text, p_since timestamptz)
RETURNS numeric LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT trnflow.closed_spend(p_project, p_since)
       + coalesce((SELECT sum(o.cost_so_far_usd) FROM trnflow.open_attempts o
                   JOIN trnflow.runs r ON r.id = o.run_id WHERE r.project = p_project), 0)
$$;
