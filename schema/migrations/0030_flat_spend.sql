-- 0030: spend reports that read the same number of rows whatever the ledger's age (issue 36).
--
-- spend_rollup has one row per project, day, pipeline, stage, kind, instance type and market:
-- at a lab's rate (matrix sweeps' stage names, every day) about one row per attempt, so a report
-- over all history (`trnflow spend --by project`, the dashboard's spend page without dates)
-- summed ~10M rows at 10M attempts. Three coarser rollups are kept beside it by the same
-- trigger, and each report reads the smallest that holds its groups and its dates
-- (Catalog::Spend):
--
--   spend_month        project, month, pipeline, kind, instance type, market: rows grow with
--                      projects x months x pipelines, not with attempts (the spend page, savings,
--                      `spend --by project|pipeline|kind|instance|market|month`);
--   spend_month_stage  the same with the stage: a pipeline's stage names are bounded by its file
--                      (`spend --by stage` over whole months);
--   spend_day          project, day, pipeline: `--by day` and reports whose dates are not whole
--                      months, budgets' this-month spend and forecast.
--
-- spend_rollup stays (stage by day with kind, instance type and market), with a `runs` column:
-- closed attempts that are their stage's first on that UTC day, so spend_by_stage_daily's
-- count of distinct runs is a sum (a stage belongs to one run and its name is unique in it).
-- interruption_rollup holds interrupted attempts by outcome (interruption_waste_daily).
-- Every figure is a sum of the same ledger columns as before: equal to the ledger to the cent
-- (tests/spend_test.cpp compares every one). spend_month and spend_day are keyed by a shard
-- as well (the closing backend's pid mod 8, as /metrics' counters of 0025): their rows are
-- few and hot, and unsharded, workers closing attempts of one project at once each waited on
-- the other's row lock until commit. `drain_bench --stages 20000 --workers 2`, side by side with
-- 0014's trigger (`--sql @` of it): unsharded 1,500-1,950 stages/s against 2,000-2,900;
-- sharded 2,265 against 2,520-2,545 (the upserts of the coarser rollups, ~10%). Readers sum.
ALTER TABLE trnflow.spend_rollup ADD COLUMN runs bigint NOT NULL DEFAULT 0;

CREATE TABLE trnflow.spend_month (
  project        text NOT NULL,
  month          date NOT NULL,  -- the first day of the UTC month the attempt started in
  pipeline       text NOT NULL,
  kind           text NOT NULL,
  instance_type  text NOT NULL,
  market         text NOT NULL,
  shard          smallint NOT NULL,  -- as /metrics' counters (0025): concurrent closes, no wait
  attempts       bigint NOT NULL,
  cached         bigint NOT NULL,  -- attempts the compile cache served (outcome 'cached')
  billed_seconds bigint NOT NULL,
  cost_usd       numeric NOT NULL,
  wasted_usd     numeric NOT NULL,
  saved_usd      numeric NOT NULL,
  on_demand_usd  numeric NOT NULL,
  baseline_usd   numeric NOT NULL,
  PRIMARY KEY (project, month, pipeline, kind, instance_type, market, shard)
);
CREATE TABLE trnflow.spend_month_stage (
  project        text NOT NULL,
  month          date NOT NULL,
  pipeline       text NOT NULL,
  stage          text NOT NULL,
  kind           text NOT NULL,
  instance_type  text NOT NULL,
  market         text NOT NULL,
  attempts       bigint NOT NULL,
  billed_seconds bigint NOT NULL,
  cost_usd       numeric NOT NULL,
  wasted_usd     numeric NOT NULL,
  saved_usd      numeric NOT NULL,
  PRIMARY KEY (project, month, pipeline, stage, kind, instance_type, market)
);
CREATE TABLE trnflow.spend_day (
  project        text NOT NULL,
  day            date NOT NULL,
  pipeline       text NOT NULL,
  shard          smallint NOT NULL,
  attempts       bigint NOT NULL,
  billed_seconds bigint NOT NULL,
  cost_usd       numeric NOT NULL,
  wasted_usd     numeric NOT NULL,
  saved_usd      numeric NOT NULL,
  PRIMARY KEY (project, day, pipeline, shard)
);
CREATE TABLE trnflow.interruption_rollup (
  project    text NOT NULL,
  day        date NOT NULL,
  pipeline   text NOT NULL,
  stage      text NOT NULL,
  outcome    text NOT NULL,
  attempts   bigint NOT NULL,
  cost_usd   numeric NOT NULL,
  wasted_usd numeric NOT NULL,
  PRIMARY KEY (project, day, pipeline, stage, outcome)
);

-- The trigger folds each statement's closed attempts into every rollup (one statement; rows
-- locked in key order, as concurrent committers must).
CREATE OR REPLACE FUNCTION trnflow.roll_up_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH n AS MATERIALIZED (
    SELECT ru.project, (a.started_at AT TIME ZONE 'UTC')::date AS day, p.name AS pipeline,
           s.name AS stage, s.kind, a.instance_type, a.market, a.outcome,
           coalesce(a.billed_seconds, 0) AS billed_seconds, coalesce(a.cost_usd, 0) AS cost_usd,
           coalesce(a.wasted_usd, 0) AS wasted_usd, coalesce(a.saved_usd, 0) AS saved_usd,
           trnflow.on_demand_usd(a) AS on_demand_usd,
           coalesce(a.baseline_usd, a.cost_usd, 0) AS baseline_usd,
           -- 1 when no attempt of the stage with a lower number started on the same UTC day
           -- (attempts of a stage are written in order: the next is claimed after the last
           -- closed), so the sum over a day's attempts of a stage name counts its runs. Inline:
           -- a function with its own search_path is never inlined.
           (a.attempt = 1 OR NOT EXISTS (
              SELECT 1 FROM trnflow.attempts b
              WHERE b.stage_id = a.stage_id AND b.attempt < a.attempt
                AND (b.started_at AT TIME ZONE 'UTC')::date
                  = (a.started_at AT TIME ZONE 'UTC')::date))::int AS first_of_day
    FROM new_rows a
    JOIN trnflow.stages s ON s.id = a.stage_id
    JOIN trnflow.runs ru ON ru.id = a.run_id
    JOIN trnflow.pipelines p ON p.id = ru.pipeline_id
    WHERE a.outcome IS NOT NULL),
  r AS (
    INSERT INTO trnflow.spend_rollup AS t
    SELECT project, day, pipeline, stage, kind, instance_type, market, count(*),
           sum(billed_seconds), sum(cost_usd), sum(wasted_usd), sum(saved_usd),
           sum(on_demand_usd), sum(baseline_usd), sum(first_of_day)
    FROM n GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (project, day, pipeline, stage, kind, instance_type, market) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts,
        billed_seconds = t.billed_seconds + EXCLUDED.billed_seconds,
        cost_usd = t.cost_usd + EXCLUDED.cost_usd, wasted_usd = t.wasted_usd + EXCLUDED.wasted_usd,
        saved_usd = t.saved_usd + EXCLUDED.saved_usd,
        on_demand_usd = t.on_demand_usd + EXCLUDED.on_demand_usd,
        baseline_usd = t.baseline_usd + EXCLUDED.baseline_usd, runs = t.runs + EXCLUDED.runs),
  m AS (
    INSERT INTO trnflow.spend_month AS t
    SELECT project, date_trunc('month', day::timestamp)::date, pipeline, kind, instance_type, market,
           (pg_backend_pid() % 8)::smallint, count(*), count(*) FILTER (WHERE outcome = 'cached'), sum(billed_seconds),
           sum(cost_usd), sum(wasted_usd), sum(saved_usd), sum(on_demand_usd), sum(baseline_usd)
    FROM n GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT (project, month, pipeline, kind, instance_type, market, shard) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts, cached = t.cached + EXCLUDED.cached,
        billed_seconds = t.billed_seconds + EXCLUDED.billed_seconds,
        cost_usd = t.cost_usd + EXCLUDED.cost_usd, wasted_usd = t.wasted_usd + EXCLUDED.wasted_usd,
        saved_usd = t.saved_usd + EXCLUDED.saved_usd,
        on_demand_usd = t.on_demand_usd + EXCLUDED.on_demand_usd,
        baseline_usd = t.baseline_usd + EXCLUDED.baseline_usd),
  ms AS (
    INSERT INTO trnflow.spend_month_stage AS t
    SELECT project, date_trunc('month', day::timestamp)::date, pipeline, stage, kind, instance_type,
           market, count(*), sum(billed_seconds), sum(cost_usd), sum(wasted_usd), sum(saved_usd)
    FROM n GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (project, month, pipeline, stage, kind, instance_type, market) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts,
        billed_seconds = t.billed_seconds + EXCLUDED.billed_seconds,
        cost_usd = t.cost_usd + EXCLUDED.cost_usd, wasted_usd = t.wasted_usd + EXCLUDED.wasted_usd,
        saved_usd = t.saved_usd + EXCLUDED.saved_usd),
  d AS (
    INSERT INTO trnflow.spend_day AS t
    SELECT project, day, pipeline, (pg_backend_pid() % 8)::smallint, count(*), sum(billed_seconds), sum(cost_usd),
           sum(wasted_usd), sum(saved_usd)
    FROM n GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (project, day, pipeline, shard) DO UPDATE
    SET attempts = t.attempts + EXCLUDED.attempts,
        billed_seconds = t.billed_seconds + EXCLUDED.billed_seconds,
        cost_usd = t.cost_usd + EXCLUDED.cost_usd, wasted_usd = t.wasted_usd + EXCLUDED.wasted_usd,
        saved_usd = t.saved_usd + EXCLUDED.saved_usd)
  INSERT INTO trnflow.interruption_rollup AS t
  SELECT project, day, pipeline, stage, outcome, count(*), sum(cost_usd), sum(wasted_usd)
  FROM n WHERE trnflow.is_preemption(outcome)
  GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
  ON CONFLICT (project, day, pipeline, stage, outcome) DO UPDATE
  SET attempts = t.attempts + EXCLUDED.attempts, cost_usd = t.cost_usd + EXCLUDED.cost_usd,
      wasted_usd = t.wasted_usd + EXCLUDED.wasted_usd;
  RETURN NULL;
END $$;

-- Every rollup from the ledger: for ledgers loaded in bulk with the triggers off
-- (Catalog::RebuildSpendRollup) and for this migration. Owner only.
CREATE FUNCTION trnflow.rebuild_spend_rollups() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  TRUNCATE trnflow.spend_rollup, trnflow.spend_month, trnflow.spend_month_stage,
           trnflow.spend_day, trnflow.interruption_rollup;
  WITH n AS MATERIALIZED (
    SELECT ru.project, (a.started_at AT TIME ZONE 'UTC')::date AS day, p.name AS pipeline,
           s.name AS stage, s.kind, a.instance_type, a.market, a.outcome,
           coalesce(a.billed_seconds, 0) AS billed_seconds, coalesce(a.cost_usd, 0) AS cost_usd,
           coalesce(a.wasted_usd, 0) AS wasted_usd, coalesce(a.saved_usd, 0) AS saved_usd,
           trnflow.on_demand_usd(a) AS on_demand_usd,
           coalesce(a.baseline_usd, a.cost_usd, 0) AS baseline_usd,
           -- 1 when no attempt of the stage with a lower number started on the same UTC day
           -- (attempts of a stage are written in order: the next is claimed after the last
           -- closed), so the sum over a day's attempts of a stage name counts its runs. Inline:
           -- a function with its own search_path is never inlined.
           (a.attempt = 1 OR NOT EXISTS (
              SELECT 1 FROM trnflow.attempts b
              WHERE b.stage_id = a.stage_id AND b.attempt < a.attempt
                AND (b.started_at AT TIME ZONE 'UTC')::date
                  = (a.started_at AT TIME ZONE 'UTC')::date))::int AS first_of_day
    FROM trnflow.attempts a
    JOIN trnflow.stages s ON s.id = a.stage_id
    JOIN trnflow.runs ru ON ru.id = a.run_id
    JOIN trnflow.pipelines p ON p.id = ru.pipeline_id
    WHERE a.outcome IS NOT NULL),
  r AS (
    INSERT INTO trnflow.spend_rollup AS t
    SELECT project, day, pipeline, stage, kind, instance_type, market, count(*),
           sum(billed_seconds), sum(cost_usd), sum(wasted_usd), sum(saved_usd),
           sum(on_demand_usd), sum(baseline_usd), sum(first_of_day)
    FROM n GROUP BY 1, 2, 3, 4, 5, 6, 7),
  m AS (
    INSERT INTO trnflow.spend_month AS t
    SELECT project, date_trunc('month', day::timestamp)::date, pipeline, kind, instance_type, market,
           0::smallint, count(*), count(*) FILTER (WHERE outcome = 'cached'), sum(billed_seconds),
           sum(cost_usd), sum(wasted_usd), sum(saved_usd), sum(on_demand_usd), sum(baseline_usd)
    FROM n GROUP BY 1, 2, 3, 4, 5, 6),
  ms AS (
    INSERT INTO trnflow.spend_month_stage AS t
    SELECT project, date_trunc('month', day::timestamp)::date, pipeline, stage, kind, instance_type,
           market, count(*), sum(billed_seconds), sum(cost_usd), sum(wasted_usd), sum(saved_usd)
    FROM n GROUP BY 1, 2, 3, 4, 5, 6, 7),
  d AS (
    INSERT INTO trnflow.spend_day AS t
    SELECT project, day, pipeline, 0::smallint, count(*), sum(billed_seconds), sum(cost_usd),
           sum(wasted_usd), sum(saved_usd)
    FROM n GROUP BY 1, 2, 3)
  INSERT INTO trnflow.interruption_rollup AS t
  SELECT project, day, pipeline, stage, outcome, count(*), sum(cost_usd), sum(wasted_usd)
  FROM n WHERE trnflow.is_preemption(outcome)
  GROUP BY 1, 2, 3, 4, 5;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.rebuild_spend_rollups() FROM PUBLIC;
SELECT trnflow.rebuild_spend_rollups();

-- Who reads them: whoever reads spend_rollup (members, the site's reader, the daemons).
DO $$
DECLARE
  t text;
  d text := trnflow.daemon_role();
BEGIN
  FOREACH t IN ARRAY ARRAY['spend_month', 'spend_month_stage', 'spend_day',
                           'interruption_rollup'] LOOP
    EXECUTE format('ALTER TABLE trnflow.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('CREATE POLICY visible ON trnflow.%I FOR SELECT USING (trnflow.can_see_project(project))', t);
    EXECUTE format('CREATE POLICY daemon_all ON trnflow.%I TO %I USING (true) WITH CHECK (true)', t, d);
    EXECUTE format('GRANT SELECT ON trnflow.%I TO %I', t, d);
    EXECUTE format('GRANT SELECT ON trnflow.%I TO %I', t, trnflow.reader_role());
  END LOOP;
END $$;
ALTER FUNCTION trnflow.ensure_project(text) RENAME TO ensure_project_0026;
CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0026(p);
  EXECUTE format('GRANT SELECT ON trnflow.spend_month, trnflow.spend_month_stage, trnflow.spend_day,
                  trnflow.interruption_rollup TO %I', trnflow.project_role(p));
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.ensure_project(text) FROM PUBLIC;
DO $$
DECLARE p text;
BEGIN
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- The daily views of 0026 read the rollups, not the ledger: the same rows and figures (their
-- names, columns and types are a contract), at a cost that follows the days asked for, not the
-- ledger's length.
CREATE OR REPLACE VIEW trnflow.spend_by_stage_daily WITH (security_invoker = true) AS
SELECT project, day, date_trunc('month', day::timestamp)::date AS month, pipeline, stage, kind,
       sum(runs)::bigint AS runs, sum(attempts)::bigint AS attempts, sum(cost_usd) AS cost_usd,
       sum(wasted_usd) AS wasted_usd, sum(saved_usd) AS saved_usd
FROM trnflow.spend_rollup
GROUP BY 1, 2, 3, 4, 5, 6;

CREATE OR REPLACE VIEW trnflow.interruption_waste_daily WITH (security_invoker = true) AS
SELECT project, day, date_trunc('month', day::timestamp)::date AS month, pipeline, stage, outcome,
       sum(attempts)::bigint AS attempts, sum(cost_usd) AS cost_usd, sum(wasted_usd) AS wasted_usd
FROM trnflow.interruption_rollup
GROUP BY 1, 2, 3, 4, 5, 6;

-- A month budget's closed spend from spend_day (a project's rows of this month: at most
-- pipelines x days), a total one's from /metrics' counters, as before.
CREATE OR REPLACE FUNCTION trnflow.closed_spend(p text, start timestamptz) RETURNS numeric
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(CASE WHEN start = '-infinity'
                       THEN (SELECT sum(cost_usd) FROM trnflow.attempt_counts WHERE project = p)
                       ELSE (SELECT sum(cost_usd) FROM trnflow.spend_day
                             WHERE project = p AND day >= start::date) END, 0)
$$;

-- A claim's project budget left (0017) takes the closed spend from closed_spend too: a total
-- budget summed every rollup row of its project on every claim of a budgeted project, a cost
-- that grew with the project's history on the hot path. The same figure (both are the sum of
-- the closed attempts' cost).
CREATE OR REPLACE FUNCTION trnflow.reserve_budgets(p_stages bigint[], p_attempts int[],
                                                   p_expected numeric[])
RETURNS TABLE (stage_id bigint, cap_usd numeric, held_usd numeric)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  i int;
  a record;
  run_left numeric;
  proj_left numeric;
  cap numeric;
  held numeric;
  b record;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_stages, 1), 0) LOOP
    SELECT s.id, s.run_id, r.project, r.budget_usd INTO a
    FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id
    WHERE s.id = p_stages[i] AND s.attempts = p_attempts[i] AND s.state = 'running';
    CONTINUE WHEN a.id IS NULL;
    PERFORM 1 FROM trnflow.runs WHERE id = a.run_id FOR UPDATE;
    PERFORM 1 FROM trnflow.budgets WHERE project = a.project FOR UPDATE;
    cap := NULL;
    held := 0;
    IF a.budget_usd IS NOT NULL THEN
      held := coalesce((SELECT sum(x.reserved_usd) FROM trnflow.open_attempts x
                        WHERE x.run_id = a.run_id AND x.stage_id <> a.id), 0);
      run_left := a.budget_usd - coalesce((SELECT sum(x.cost_usd) FROM trnflow.attempts x
                                           WHERE x.run_id = a.run_id), 0);
      cap := run_left - held;
    END IF;
    SELECT bu.amount_usd, CASE WHEN bu.period = 'month'
                               THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                               ELSE '-infinity'::timestamptz END AS start
    INTO b FROM trnflow.budgets bu WHERE bu.project = a.project;
    IF b.amount_usd IS NOT NULL THEN
      SELECT b.amount_usd
             - trnflow.closed_spend(a.project, b.start)
             - coalesce((SELECT sum(x.reserved_usd) FROM trnflow.open_attempts x
                         JOIN trnflow.runs r ON r.id = x.run_id
                         WHERE r.project = a.project AND r.state = 'running'
                           AND x.stage_id <> a.id), 0)
      INTO proj_left;
      IF cap IS NULL OR proj_left < cap THEN
        held := coalesce((SELECT sum(x.reserved_usd) FROM trnflow.open_attempts x
                          JOIN trnflow.runs r ON r.id = x.run_id
                          WHERE r.project = a.project AND r.state = 'running'
                            AND x.stage_id <> a.id), 0);
        cap := proj_left;
      END IF;
    END IF;
    CONTINUE WHEN cap IS NULL;
    cap := greatest(cap, 0);
    UPDATE trnflow.stages SET attempt_cap_usd = cap,
           attempt_reserved_usd = CASE WHEN p_expected[i] IS NULL THEN cap
                                       ELSE least(cap, p_expected[i]) END
    WHERE id = a.id;
    stage_id := p_stages[i];
    cap_usd := cap;
    held_usd := held;
    RETURN NEXT;
  END LOOP;
END $$;
