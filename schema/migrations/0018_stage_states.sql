-- The queue leaves `stages` (bench/analysis.md, 2026-11-27).
--
-- Every index of `stages` that found stages by state (ready, retry due, leased, unfinished,
-- ended badly) was partial on `state`, so each state change was a non-HOT update: the wide
-- stage row was copied to a new place and every index took a new entry, a claim four
-- (primary key, (run_id, name) with its uniqueness check, unfinished, leased) and a close two.
-- Those were the largest single costs of a stage. Now no index of `stages` holds `state` or a
-- column the hot path writes, so a claim, a close, a release and a heartbeat are HOT updates,
-- and the states are found through a narrow table beside it:
--
--   trnflow.stage_states: one row per stage that has not (yet) succeeded, with what a claim
--   sorts and fits by: blocked, ready, retry_wait, running, failed, skipped, cancelled. A stage
--   that succeeds (or is served from the cache) leaves it. Its rows are a few dozen bytes.
--
-- `stages.state` stays the truth; stage_states follows it from the statement triggers on
-- `stages` (the one that already records the change feed, now in the same statement), so no
-- writer — function, worker, a person with psql — can leave the two apart. A claim locks its
-- candidates' stage_states rows (SKIP LOCKED) and then updates the stage rows; anything else
-- that changes a ready stage's state locks its stage_states row first (cancel_run,
-- reset_stages below), so the two lock orders never cross.

CREATE TABLE trnflow.stage_states (
  stage_id        bigint PRIMARY KEY,
  run_id          bigint NOT NULL,
  project         text NOT NULL,
  pool            text NOT NULL,
  state           text NOT NULL CHECK (state IN ('blocked', 'ready', 'retry_wait', 'running',
                                                 'failed', 'skipped', 'cancelled')),
  priority        int NOT NULL,
  ready_at        timestamptz,      -- ready: since; retry_wait: when due (as stages.ready_at)
  instance_count  int NOT NULL
) WITH (fillfactor = 80);
-- Whether a run still has work, or a stage that ended badly: by run and state.
CREATE INDEX stage_states_run ON trnflow.stage_states (run_id, state);
-- The claim's order, per pool and project.
CREATE INDEX stage_states_ready ON trnflow.stage_states (pool, project, priority DESC, ready_at,
                                                        stage_id)
  WHERE state = 'ready';
CREATE INDEX stage_states_retry_due ON trnflow.stage_states (ready_at) WHERE state = 'retry_wait';
-- Leases to rescue, attempts running now.
CREATE INDEX stage_states_running ON trnflow.stage_states (stage_id) WHERE state = 'running';

INSERT INTO trnflow.stage_states
SELECT id, run_id, project, pool, state, priority, ready_at, instance_count
FROM trnflow.stages WHERE state NOT IN ('succeeded', 'cached');

DROP INDEX IF EXISTS trnflow.stages_ready;
DROP INDEX IF EXISTS trnflow.stages_leased;
DROP INDEX IF EXISTS trnflow.stages_retry_due;
DROP INDEX IF EXISTS trnflow.stages_unfinished;
DROP INDEX IF EXISTS trnflow.stages_ended_badly;

-- The change feed and stage_states, from one comparison of a statement's old and new rows.
-- Rows whose state and due time did not change (a heartbeat, a live progress report) are not
-- touched. Succeeded and cached stages leave stage_states; any other state is upserted.
CREATE OR REPLACE FUNCTION trnflow.record_stage_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_nestloop = off AS $$
DECLARE newest bigint;
BEGIN
  WITH moved AS MATERIALIZED (
    SELECT n.id, n.run_id, n.project, n.pool, n.name, n.state, n.priority, n.ready_at,
           n.instance_count, o.state AS was
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state IS DISTINCT FROM n.state OR o.ready_at IS DISTINCT FROM n.ready_at),
  feed AS (
    INSERT INTO trnflow.changes (project, run_id, stage_id, stage, state)
    SELECT project, run_id, id, name, state FROM moved
    WHERE was IS DISTINCT FROM state
    ORDER BY id
    RETURNING id),
  settled AS (
    DELETE FROM trnflow.stage_states t USING moved m
    WHERE t.stage_id = m.id AND m.state IN ('succeeded', 'cached')),
  placed AS (
    INSERT INTO trnflow.stage_states AS t
    SELECT id, run_id, project, pool, state, priority, ready_at, instance_count FROM moved
    WHERE state NOT IN ('succeeded', 'cached')
    ORDER BY id
    ON CONFLICT (stage_id) DO UPDATE SET state = EXCLUDED.state, ready_at = EXCLUDED.ready_at)
  SELECT max(id) INTO newest FROM feed;
  IF newest IS NOT NULL THEN
    PERFORM pg_notify('trnflow_changes', newest::text);
  END IF;
  RETURN NULL;
END $$;

CREATE FUNCTION trnflow.place_new_stages() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO trnflow.stage_states
  SELECT id, run_id, project, pool, state, priority, ready_at, instance_count FROM new_rows
  WHERE state NOT IN ('succeeded', 'cached');
  RETURN NULL;
END $$;
CREATE TRIGGER stages_placed AFTER INSERT ON trnflow.stages
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.place_new_stages();

CREATE FUNCTION trnflow.forget_stages() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    TRUNCATE trnflow.stage_states;
  ELSE
    DELETE FROM trnflow.stage_states t USING old_rows o WHERE t.stage_id = o.id;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER stages_forgotten AFTER DELETE ON trnflow.stages
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.forget_stages();
CREATE TRIGGER stages_truncated AFTER TRUNCATE ON trnflow.stages
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.forget_stages();

-- Rights: the daemons read and lock (a claim's FOR UPDATE needs UPDATE); only the triggers
-- write. Members and the site's reader see their projects' rows, as they see their stages.
ALTER TABLE trnflow.stage_states ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trnflow.stage_states FOR SELECT
  USING (trnflow.can_see_project(project));
DO $$
DECLARE d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.stage_states TO %I USING (true) WITH CHECK (true)', d);
  EXECUTE format('GRANT SELECT, UPDATE ON trnflow.stage_states TO %I', d);
  EXECUTE format('GRANT SELECT ON trnflow.stage_states TO %I', trnflow.reader_role());
END $$;
CREATE OR REPLACE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0008(p);
  EXECUTE format('GRANT SELECT ON trnflow.event_log, trnflow.open_attempts, trnflow.stage_states TO %I',
                 trnflow.project_role(p));
END $$;

-- Running attempts are found through stage_states' index of running stages.
CREATE OR REPLACE VIEW trnflow.open_attempts WITH (security_invoker = true) AS
SELECT s.attempt_id AS id, s.id AS stage_id, s.run_id, s.attempts AS attempt,
       s.attempt_worker_id AS worker_id, s.attempt_worker_name AS worker_name, s.instance_type,
       s.instance_count, s.attempt_market AS market, s.attempt_price_usd_hour AS price_usd_hour,
       s.attempt_on_demand_price_usd_hour AS on_demand_price_usd_hour,
       s.attempt_started_at AS started_at, s.attempt_queued_at AS queued_at,
       s.attempt_progress_from AS progress_from, s.attempt_cap_usd AS cap_usd,
       s.attempt_reserved_usd AS reserved_usd, s.attempt_executor_job AS executor_job
FROM trnflow.stage_states t
JOIN trnflow.stages s ON s.id = t.stage_id
WHERE t.state = 'running' AND s.state = 'running';

CREATE OR REPLACE VIEW trnflow.attempt_ledger WITH (security_invoker = true) AS
SELECT a.run_id, r.project, p.name AS pipeline, s.name AS stage, s.kind, a.attempt,
       a.worker_name AS worker, a.instance_type, a.instance_count, a.market, a.started_at,
       a.finished_at, a.billed_seconds::numeric / 3600.0 AS sim_hours, a.outcome, a.cost_usd,
       a.wasted_usd, a.saved_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
UNION ALL
SELECT s.run_id, r.project, p.name, s.name, s.kind, s.attempts, s.attempt_worker_name,
       s.instance_type, s.instance_count, s.attempt_market, s.attempt_started_at,
       NULL::timestamptz, NULL::numeric, NULL::text, NULL::numeric(18,6), NULL::numeric(18,6),
       NULL::numeric(18,6)
FROM trnflow.stage_states t
JOIN trnflow.stages s ON s.id = t.stage_id
JOIN trnflow.runs r ON r.id = s.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE t.state = 'running' AND s.state = 'running';

DO $$
DECLARE p text;
BEGIN
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- The functions that change stages' states outside the hot path: submit_run counts a
-- project's unfinished stages from stage_states; cancel_run and reset_stages lock ready
-- stages' stage_states rows before their stage rows, in the claim's order.
CREATE OR REPLACE FUNCTION trnflow.submit_run(
  p_project text, p_pipeline text, p_spec_hash text, p_source text, p_params jsonb,
  p_speed float8, p_seed bigint, p_spot_rate float8, p_budget numeric, p_workdir text,
  p_retry_failed boolean, p_names text[], p_kinds text[], p_pools text[], p_types text[],
  p_counts int[], p_markets text[], p_pending int[], p_specs jsonb[], p_dep_from int[],
  p_dep_to int[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_pipeline bigint;
  v_run bigint;
  n int := coalesce(array_length(p_names, 1), 0);
  quota record;
  queued bigint;
  ids bigint[];
BEGIN
  PERFORM trnflow.require_write(p_project, 'submitting a run');
  IF p_project !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'invalid project name "%"', p_project USING ERRCODE = '22023',
      HINT = 'use lowercase letters, digits and -, starting with a letter or digit';
  END IF;
  -- Members submit only to projects that exist; the daemon's submissions create them.
  IF NOT EXISTS (SELECT 1 FROM trnflow.projects WHERE name = p_project) THEN
    IF NOT trnflow.has_role(session_user, trnflow.daemon_role())
       AND session_user <> (SELECT tableowner FROM pg_tables WHERE schemaname = 'trnflow' AND tablename = 'runs') THEN
      RAISE EXCEPTION 'there is no project "%"', p_project USING ERRCODE = '42501';
    END IF;
    INSERT INTO trnflow.projects (name) VALUES (p_project) ON CONFLICT (name) DO NOTHING;
  END IF;
  SELECT max_stages_per_run, max_queued_stages INTO quota
  FROM trnflow.projects WHERE name = p_project FOR SHARE;
  IF n > quota.max_stages_per_run THEN
    RAISE EXCEPTION 'the run has % stages; project "%" allows at most % per run', n, p_project,
      quota.max_stages_per_run USING ERRCODE = 'TF001',
      HINT = 'split the sweep into several runs, or an administrator raises the quota: trnflow project add ' || p_project || ' --max-stages-per-run N';
  END IF;
  SELECT count(*) INTO queued
  FROM trnflow.runs r JOIN trnflow.stage_states t ON t.run_id = r.id
  WHERE r.project = p_project AND r.state = 'running'
    AND t.state IN ('blocked', 'ready', 'running', 'retry_wait');
  IF queued + n > quota.max_queued_stages THEN
    RAISE EXCEPTION 'project "%" has % unfinished stages; % more would pass its quota of %',
      p_project, queued, n, quota.max_queued_stages USING ERRCODE = 'TF001',
      HINT = 'wait for running work to finish, or an administrator raises it: trnflow project add ' || p_project || ' --max-queued-stages N';
  END IF;

  INSERT INTO trnflow.pipelines (name, spec_hash, source) VALUES (p_pipeline, p_spec_hash, p_source)
  ON CONFLICT (name, spec_hash) DO NOTHING RETURNING id INTO v_pipeline;
  IF v_pipeline IS NULL THEN
    SELECT id INTO v_pipeline FROM trnflow.pipelines WHERE name = p_pipeline AND spec_hash = p_spec_hash;
  END IF;
  INSERT INTO trnflow.runs (pipeline_id, project, params, speed, seed, spot_rate_multiplier,
                            budget_usd, workdir, retry_failed_compilation, submitted_by)
  VALUES (v_pipeline, p_project, p_params, p_speed, p_seed, p_spot_rate, p_budget, p_workdir,
          p_retry_failed, session_user)
  RETURNING id INTO v_run;
  WITH input AS (
    SELECT * FROM unnest(p_names, p_kinds, p_pools, p_types, p_counts, p_markets, p_pending, p_specs)
      WITH ORDINALITY AS t(name, kind, pool, instance_type, instance_count, market, pending, spec, ord)),
  ins AS (
    INSERT INTO trnflow.stages (run_id, project, name, kind, pool, instance_type, instance_count,
                                market, state, pending_needs, spec, ready_at)
    SELECT v_run, p_project, name, kind, pool, instance_type, instance_count, market,
           CASE WHEN pending = 0 THEN 'ready' ELSE 'blocked' END, pending, spec,
           CASE WHEN pending = 0 THEN now() END
    FROM input ORDER BY ord
    RETURNING id, name)
  SELECT array_agg(ins.id ORDER BY input.ord) INTO ids FROM ins JOIN input ON input.name = ins.name;
  IF coalesce(array_length(p_dep_from, 1), 0) > 0 THEN
    INSERT INTO trnflow.stage_deps (stage_id, needs_id)
    SELECT ids[f], ids[t] FROM unnest(p_dep_from, p_dep_to) AS d(f, t);
  END IF;
  PERFORM pg_notify('trnflow_ready', pool)
  FROM (SELECT DISTINCT pool FROM unnest(p_pools, p_pending) AS t(pool, pending)
        WHERE pending = 0) x;
  RETURN v_run;
END $$;

CREATE OR REPLACE FUNCTION trnflow.cancel_run(p_run bigint, p_reason text,
  OUT cancelled int, OUT stages_cancelled int, OUT stages_running int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE proj text;
BEGIN
  SELECT project INTO proj FROM trnflow.runs WHERE id = p_run;
  IF proj IS NULL THEN
    RAISE EXCEPTION 'no run %', p_run USING ERRCODE = 'TF002',
      HINT = '`trnflow runs` lists the runs you can see';
  END IF;
  PERFORM trnflow.require_write(proj, 'cancelling run ' || p_run);
  IF p_reason NOT IN ('cancelled', 'budget_exceeded')
     OR (p_reason = 'budget_exceeded' AND NOT trnflow.has_role(session_user, trnflow.daemon_role())
         AND session_user <> (SELECT tableowner FROM pg_tables WHERE schemaname = 'trnflow' AND tablename = 'runs')) THEN
    RAISE EXCEPTION 'a run is cancelled for reason "cancelled" only' USING ERRCODE = '42501';
  END IF;
  UPDATE trnflow.runs SET state = 'cancelled', finished_at = now(), cancel_reason = p_reason
  WHERE id = p_run AND state = 'running';
  GET DIAGNOSTICS cancelled = ROW_COUNT;
  stages_cancelled := 0;
  IF cancelled > 0 THEN
    -- Claimers lock ready stages' stage_states rows before their stage rows: so does this.
    PERFORM 1 FROM trnflow.stage_states
    WHERE run_id = p_run AND state = 'ready' ORDER BY stage_id FOR UPDATE;
    UPDATE trnflow.stages SET state = 'cancelled', finished_at = now()
    WHERE run_id = p_run AND state IN ('blocked', 'ready', 'retry_wait');
    GET DIAGNOSTICS stages_cancelled = ROW_COUNT;
    PERFORM pg_notify('trnflow_cancel', p_run::text);
  END IF;
  SELECT count(*) INTO stages_running FROM trnflow.stage_states
  WHERE run_id = p_run AND state = 'running';
END $$;

CREATE OR REPLACE FUNCTION trnflow.reset_stages(p_run bigint, p_stage text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  proj text;
  st text;
  ids bigint[];
  busy text;
  n int;
BEGIN
  SELECT project, state INTO proj, st FROM trnflow.runs WHERE id = p_run FOR UPDATE;
  IF proj IS NULL THEN
    RAISE EXCEPTION 'no run %', p_run USING ERRCODE = 'TF002',
      HINT = '`trnflow runs` lists the runs you can see';
  END IF;
  PERFORM trnflow.require_write(proj, CASE WHEN p_stage IS NULL THEN 'resuming' ELSE 'retrying a stage of' END || ' run ' || p_run);
  IF p_stage IS NULL AND st NOT IN ('failed', 'cancelled') THEN
    RAISE EXCEPTION 'run % is %; only a failed or cancelled run can be resumed%', p_run, st,
      CASE WHEN st = 'succeeded' THEN ' (use `trnflow retry RUN STAGE` to redo a stage)' ELSE '' END
      USING ERRCODE = 'TF002';
  END IF;
  WITH RECURSIVE target AS (
    SELECT id FROM trnflow.stages
    WHERE run_id = p_run AND ((p_stage IS NOT NULL AND (name = p_stage OR name LIKE p_stage || '[%'))
                              OR (p_stage IS NULL AND state IN ('failed', 'cancelled', 'skipped')))),
  down AS (
    SELECT id FROM target
    UNION
    SELECT d.stage_id FROM trnflow.stage_deps d JOIN down ON d.needs_id = down.id WHERE p_stage IS NOT NULL)
  SELECT array_agg(id ORDER BY id) FROM down INTO ids;
  IF ids IS NULL THEN
    IF p_stage IS NULL THEN
      RAISE EXCEPTION 'run % has nothing to resume', p_run USING ERRCODE = 'TF002';
    END IF;
    RAISE EXCEPTION 'run % has no stage ''%''; `trnflow show %` lists them', p_run, p_stage, p_run
      USING ERRCODE = 'TF002';
  END IF;
  -- Claimers lock ready stages' stage_states rows before their stage rows: so does this.
  PERFORM 1 FROM trnflow.stage_states WHERE stage_id = ANY(ids) AND state = 'ready'
  ORDER BY stage_id FOR UPDATE;
  PERFORM 1 FROM trnflow.stages WHERE id = ANY(ids) ORDER BY id FOR UPDATE;
  SELECT name INTO busy FROM trnflow.stages WHERE id = ANY(ids) AND state = 'running' LIMIT 1;
  IF busy IS NOT NULL THEN
    RAISE EXCEPTION 'stage ''%'' of run % is running; wait for it or `trnflow cancel` the run first',
      busy, p_run USING ERRCODE = 'TF002';
  END IF;
  WITH updated AS (
    UPDATE trnflow.stages s
    SET pending_needs = p.pending,
        state = CASE WHEN p.pending = 0 THEN 'ready' ELSE 'blocked' END,
        ready_at = CASE WHEN p.pending = 0 THEN now() END,
        errors = 0, preemptions = 0, market = s.spec->>'market', finished_at = NULL,
        progress = CASE WHEN p_stage IS NOT NULL THEN 0 ELSE s.progress END
    FROM (SELECT r.id, (SELECT count(*) FROM trnflow.stage_deps d
                        JOIN trnflow.stages x ON x.id = d.needs_id
                        WHERE d.stage_id = r.id
                          AND (x.state NOT IN ('succeeded', 'cached') OR x.id = ANY(ids))) AS pending
          FROM unnest(ids) AS r(id)) p
    WHERE s.id = p.id
    RETURNING s.pool, s.state)
  SELECT count(*) INTO n FROM (SELECT pg_notify('trnflow_ready', pool) FROM updated
                               WHERE state = 'ready' GROUP BY pool) x;
  SELECT count(*) INTO n FROM unnest(ids);
  UPDATE trnflow.runs SET state = 'running', finished_at = NULL, cancel_reason = NULL
  WHERE id = p_run AND state <> 'running';
  RETURN n;
END $$;
