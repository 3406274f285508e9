-- The queue out of `stages` (bench/analysis.md, 2026-11-27, "The narrow queue").
--
-- A claim and a completion each updated the wide stage row in a way PostgreSQL could not do
-- in place: `state` appeared in the predicates of five partial indexes (ready, leased,
-- unfinished, retry due, ended badly), so every state change wrote a new row version on
-- another page and a new entry in every index of the table. Now nothing indexes a column the
-- claim or a successful close writes:
--   - ready_stages: the stages that are ready, with what the claim orders them by. Whatever
--     makes a stage ready inserts its row (submit, release, retry promotion, resume, a
--     completion back to ready); the claim deletes it, so does a cancel.
--   - running_stages: the stages that run under a lease. The claim inserts, the completion
--     deletes. The rescuer, open_attempts, quotas and the dashboard read running stages here.
--   - stages_waiting: blocked stages (pending_needs > 0, which skip and cancel now zero) and
--     stages waiting out a retry backoff (retry_at, set with state retry_wait, cleared when
--     they become ready again), by run.
--   - a run's bad endings (cancelled, failed, skipped) are counted when it finishes, over its
--     own stages, by trnflow.run_outcome.
-- `stages` keeps its state column, the truth every reader reads; the two tables are keyed by
-- (run, stage), so "has this run anything left?" is two index probes and one more into
-- stages_waiting. With half of each page free (fillfactor 50), the claim's and the close's new
-- row versions stay on their page: heap-only updates, no index entries.

-- Daemons of the previous version would go on claiming, completing and promoting without
-- keeping the new tables (a released stage would never be claimed, a lost one never
-- rescued): this one migration needs them stopped first.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM trnflow.workers
             WHERE stopped_at IS NULL AND heartbeat_at > now() - interval '60 seconds')
     OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks
                WHERE locktype = 'relation' AND granted
                  AND relation = 'trnflow.leader_lock'::regclass
                  AND database = (SELECT oid FROM pg_catalog.pg_database
                                  WHERE datname = current_database())) THEN
    RAISE EXCEPTION 'migration 0022 moves the queue out of trnflow.stages, and workers or a scheduler of the previous version are running on this catalog'
      USING ERRCODE = 'TF001',  -- refused (exit 4)
            HINT = 'stop every `trnflow worker` (they hand their running stages back) and every `trnflow scheduler`, run `trnflow db migrate` again, then start the new version (docs/operations.md, Upgrades)';
  END IF;
END $$;

CREATE TABLE trnflow.ready_stages (
  run_id         bigint NOT NULL,
  stage_id       bigint NOT NULL,
  project        text NOT NULL,
  pool           text NOT NULL,
  priority       int NOT NULL,
  ready_at       timestamptz NOT NULL,
  instance_count int NOT NULL,
  PRIMARY KEY (run_id, stage_id)
);
CREATE INDEX ready_stages_claim ON trnflow.ready_stages (pool, project, priority DESC, ready_at, stage_id);

CREATE TABLE trnflow.running_stages (
  run_id   bigint NOT NULL,
  stage_id bigint NOT NULL,
  project  text NOT NULL,
  PRIMARY KEY (run_id, stage_id)
);

ALTER TABLE trnflow.stages ADD COLUMN retry_at timestamptz;

-- Fill them from the stages as they are.
INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at, instance_count)
SELECT run_id, id, project, pool, priority, coalesce(ready_at, now()), instance_count
FROM trnflow.stages WHERE state = 'ready';
INSERT INTO trnflow.running_stages (run_id, stage_id, project)
SELECT run_id, id, project FROM trnflow.stages WHERE state = 'running';
UPDATE trnflow.stages SET retry_at = coalesce(ready_at, now()) WHERE state = 'retry_wait';
UPDATE trnflow.stages SET pending_needs = 0 WHERE state <> 'blocked' AND pending_needs > 0;

DROP INDEX trnflow.stages_ready;
DROP INDEX trnflow.stages_leased;
DROP INDEX trnflow.stages_unfinished;
DROP INDEX trnflow.stages_retry_due;
DROP INDEX trnflow.stages_ended_badly;
CREATE INDEX stages_waiting ON trnflow.stages (run_id) WHERE pending_needs > 0 OR retry_at IS NOT NULL;
CREATE INDEX stages_retry_due ON trnflow.stages (retry_at) WHERE retry_at IS NOT NULL;
-- Room on each page for a new version of each row (new pages; old ones as rows move).
ALTER TABLE trnflow.stages SET (fillfactor = 50);

-- Who sees and writes them: as `stages`.
ALTER TABLE trnflow.ready_stages ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.running_stages ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trnflow.ready_stages FOR SELECT USING (trnflow.can_see_project(project));
CREATE POLICY visible ON trnflow.running_stages FOR SELECT USING (trnflow.can_see_project(project));
ALTER FUNCTION trnflow.ensure_project(text) RENAME TO ensure_project_0017;
CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0017(p);
  EXECUTE format('GRANT SELECT ON trnflow.ready_stages, trnflow.running_stages TO %I',
                 trnflow.project_role(p));
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.ensure_project(text) FROM PUBLIC;
DO $$
DECLARE
  d text := trnflow.daemon_role();
  p text;
BEGIN
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.ready_stages TO %I USING (true) WITH CHECK (true)', d);
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.running_stages TO %I USING (true) WITH CHECK (true)', d);
  -- UPDATE on the queue: a claim locks its rows (FOR UPDATE) before it deletes them.
  EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON trnflow.ready_stages TO %I', d);
  EXECUTE format('GRANT SELECT, INSERT, DELETE ON trnflow.running_stages TO %I', d);
  -- The reader reads open_attempts, which reads running_stages.
  EXECUTE format('GRANT SELECT ON trnflow.running_stages TO %I', trnflow.reader_role());
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- The attempts running now: by running_stages, not by a scan of every stage.
CREATE OR REPLACE VIEW trnflow.open_attempts WITH (security_invoker = true) AS
SELECT s.attempt_id AS id, s.id AS stage_id, s.run_id, s.attempts AS attempt,
       s.attempt_worker_id AS worker_id, s.attempt_worker_name AS worker_name, s.instance_type,
       s.instance_count, s.attempt_market AS market, s.attempt_price_usd_hour AS price_usd_hour,
       s.attempt_on_demand_price_usd_hour AS on_demand_price_usd_hour,
       s.attempt_started_at AS started_at, s.attempt_queued_at AS queued_at,
       s.attempt_progress_from AS progress_from, s.attempt_cap_usd AS cap_usd,
       s.attempt_reserved_usd AS reserved_usd, s.attempt_executor_job AS executor_job
FROM trnflow.running_stages q
JOIN trnflow.stages s ON s.id = q.stage_id
WHERE s.state = 'running';

-- How a run ended, once nothing in it can change: over its own stages (by the (run, name)
-- key), whatever the statistics say; called once per finishing run.
CREATE FUNCTION trnflow.run_outcome(p_run bigint) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
  SELECT CASE
    WHEN EXISTS (SELECT 1 FROM trnflow.stages s WHERE s.run_id = p_run AND s.state = 'cancelled')
      THEN 'cancelled'
    WHEN EXISTS (SELECT 1 FROM trnflow.stages s WHERE s.run_id = p_run
                 AND s.state IN ('failed', 'skipped'))
      THEN 'failed'
    ELSE 'succeeded' END
$$;
REVOKE EXECUTE ON FUNCTION trnflow.run_outcome(bigint) FROM PUBLIC;

-- Is anything in a run still to run? Three index probes. No SET clause, so the planner
-- inlines it into the statement that calls it (every name in it is schema-qualified).
CREATE FUNCTION trnflow.run_has_unfinished(p_run bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM trnflow.ready_stages q WHERE q.run_id = p_run)
      OR EXISTS (SELECT 1 FROM trnflow.running_stages q WHERE q.run_id = p_run)
      OR EXISTS (SELECT 1 FROM trnflow.stages s WHERE s.run_id = p_run
                 AND (s.pending_needs > 0 OR s.retry_at IS NOT NULL))
$$;
REVOKE EXECUTE ON FUNCTION trnflow.run_has_unfinished(bigint) FROM PUBLIC;

DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.run_outcome(bigint), trnflow.run_has_unfinished(bigint) TO %I',
                 trnflow.daemon_role());
END $$;

-- The claim's first step: for each project with ready stages of the pool (found by skipping
-- through the queue's index), lock its first candidates in priority order, skipping rows
-- other workers hold. By the index whatever the statistics say: before the queue was first
-- analyzed (a big run just submitted), the planner sorted every ready row of a project for
-- each claim (~30 ms per claim at 100,000 ready stages).
CREATE FUNCTION trnflow.lock_ready_stages(p_pool text, p_capacity int, p_run bigint, p_max int)
RETURNS TABLE (o_row tid, o_stage bigint, o_project text, o_instance_count int, o_priority int,
               o_ready_at timestamptz)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH RECURSIVE projects AS (
    (SELECT q.project FROM trnflow.ready_stages q
     WHERE q.pool = p_pool AND (p_run = 0 OR q.run_id = p_run)
     ORDER BY q.project LIMIT 1)
    UNION ALL
    SELECT (SELECT q.project FROM trnflow.ready_stages q
            WHERE q.pool = p_pool AND q.project > p.project AND (p_run = 0 OR q.run_id = p_run)
            ORDER BY q.project LIMIT 1)
    FROM projects p WHERE p.project IS NOT NULL)
  SELECT c.ctid, c.stage_id, c.project, c.instance_count, c.priority, c.ready_at
  FROM projects p CROSS JOIN LATERAL (
    SELECT q.ctid, q.stage_id, q.project, q.instance_count, q.priority, q.ready_at
    FROM trnflow.ready_stages q
    WHERE q.pool = p_pool AND q.project = p.project AND q.instance_count <= p_capacity
      AND (p_run = 0 OR q.run_id = p_run)
    ORDER BY q.priority DESC, q.ready_at, q.stage_id
    LIMIT least(p_capacity, coalesce(nullif(p_max, 0), p_capacity))
    FOR UPDATE SKIP LOCKED) c
  WHERE p.project IS NOT NULL;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.lock_ready_stages(text, int, bigint, int) FROM PUBLIC;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.lock_ready_stages(text, int, bigint, int) TO %I',
                 trnflow.daemon_role());
END $$;

-- Releasing dependents: as 0021, and the stages made ready join the queue.
CREATE OR REPLACE FUNCTION trnflow.release_dependents(p_done bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
  RETURN QUERY
  WITH dec AS (
    SELECT d.stage_id, count(*) AS n
    FROM trnflow.stage_deps d JOIN unnest(p_done) AS done(id) ON d.needs_id = done.id
    GROUP BY d.stage_id),
  released AS (
    UPDATE trnflow.stages s
    SET pending_needs = s.pending_needs - dec.n,
        state = CASE WHEN s.state = 'blocked' AND s.pending_needs - dec.n = 0
                     THEN 'ready' ELSE s.state END,
        ready_at = CASE WHEN s.state = 'blocked' AND s.pending_needs - dec.n = 0
                        THEN now() ELSE s.ready_at END
    FROM dec WHERE s.id = dec.stage_id
    RETURNING s.id, s.run_id, s.project, s.pool, s.priority, s.ready_at, s.instance_count,
              s.state),
  queued AS (
    INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at,
                                      instance_count)
    SELECT run_id, id, project, pool, priority, ready_at, instance_count
    FROM released WHERE state = 'ready'
    RETURNING stage_id)
  SELECT stage_id FROM queued;
END $$;

-- Submitting: as 0019; the quota counts unfinished stages through the queue tables, and the
-- ready stages join the queue.
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
  unknown_type text;
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
  SELECT (SELECT count(*) FROM trnflow.ready_stages WHERE project = p_project)
       + (SELECT count(*) FROM trnflow.running_stages WHERE project = p_project)
       + (SELECT count(*) FROM trnflow.runs r JOIN trnflow.stages s ON s.run_id = r.id
          WHERE r.project = p_project AND r.state = 'running'
            AND (s.pending_needs > 0 OR s.retry_at IS NOT NULL))
  INTO queued;
  IF queued + n > quota.max_queued_stages THEN
    RAISE EXCEPTION 'project "%" has % unfinished stages; % more would pass its quota of %',
      p_project, queued, n, quota.max_queued_stages USING ERRCODE = 'TF001',
      HINT = 'wait for running work to finish, or an administrator raises it: trnflow project add ' || p_project || ' --max-queued-stages N';
  END IF;

  -- What the dropped foreign key checked once per stage, checked once per instance type.
  SELECT t INTO unknown_type
  FROM (SELECT DISTINCT t FROM unnest(p_types) AS u(t)) d
  WHERE NOT EXISTS (SELECT 1 FROM trnflow.instance_types i WHERE i.name = d.t)
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'unknown instance type "%"', unknown_type USING ERRCODE = '23503',
      HINT = 'see `trnflow instances` for the catalog';
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
  -- Ids are drawn first, in the order of the arrays, so edges map positions to ids without
  -- joining the inserted rows back to the input by name (a sort of every row, spilled to disk).
  ids := ARRAY(SELECT nextval('trnflow.stages_id_seq') FROM generate_series(1, n));
  INSERT INTO trnflow.stages (id, run_id, project, name, kind, pool, instance_type,
                              instance_count, market, state, pending_needs, spec, ready_at)
  SELECT ids[ord], v_run, p_project, name, kind, pool, instance_type, instance_count, market,
         CASE WHEN pending = 0 THEN 'ready' ELSE 'blocked' END, pending, spec,
         CASE WHEN pending = 0 THEN now() END
  FROM unnest(p_names, p_kinds, p_pools, p_types, p_counts, p_markets, p_pending, p_specs)
    WITH ORDINALITY AS t(name, kind, pool, instance_type, instance_count, market, pending, spec, ord);
  INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at,
                                    instance_count)
  SELECT v_run, ids[ord], p_project, pool, 0, now(), instance_count
  FROM unnest(p_pools, p_counts, p_pending) WITH ORDINALITY AS t(pool, instance_count, pending, ord)
  WHERE pending = 0;
  IF coalesce(array_length(p_dep_from, 1), 0) > 0 THEN
    INSERT INTO trnflow.stage_deps (stage_id, needs_id)
    SELECT ids[f], ids[t] FROM unnest(p_dep_from, p_dep_to) AS d(f, t);
  END IF;
  PERFORM pg_notify('trnflow_ready', pool)
  FROM (SELECT DISTINCT pool FROM unnest(p_pools, p_pending) AS x(pool, pending)
        WHERE pending = 0) x;
  RETURN v_run;
END $$;

-- Cancelling: as 0008; cancelled stages leave the queue and wait for nothing.
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
    UPDATE trnflow.stages SET state = 'cancelled', finished_at = now(), pending_needs = 0,
                              retry_at = NULL
    WHERE run_id = p_run AND state IN ('blocked', 'ready', 'retry_wait');
    GET DIAGNOSTICS stages_cancelled = ROW_COUNT;
    DELETE FROM trnflow.ready_stages WHERE run_id = p_run;
    PERFORM pg_notify('trnflow_cancel', p_run::text);
  END IF;
  SELECT count(*) INTO stages_running FROM trnflow.running_stages WHERE run_id = p_run;
END $$;

-- Resume and retry: as 0008; the stages reset leave the queue and those ready rejoin it.
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
  PERFORM 1 FROM trnflow.stages WHERE id = ANY(ids) ORDER BY id FOR UPDATE;
  SELECT name INTO busy FROM trnflow.stages WHERE id = ANY(ids) AND state = 'running' LIMIT 1;
  IF busy IS NOT NULL THEN
    RAISE EXCEPTION 'stage ''%'' of run % is running; wait for it or `trnflow cancel` the run first',
      busy, p_run USING ERRCODE = 'TF002';
  END IF;
  DELETE FROM trnflow.ready_stages WHERE run_id = p_run AND stage_id = ANY(ids);
  WITH updated AS (
    UPDATE trnflow.stages s
    SET pending_needs = p.pending,
        state = CASE WHEN p.pending = 0 THEN 'ready' ELSE 'blocked' END,
        ready_at = CASE WHEN p.pending = 0 THEN now() END,
        errors = 0, preemptions = 0, market = s.spec->>'market', finished_at = NULL,
        retry_at = NULL,
        progress = CASE WHEN p_stage IS NOT NULL THEN 0 ELSE s.progress END
    FROM (SELECT r.id, (SELECT count(*) FROM trnflow.stage_deps d
                        JOIN trnflow.stages x ON x.id = d.needs_id
                        WHERE d.stage_id = r.id
                          AND (x.state NOT IN ('succeeded', 'cached') OR x.id = ANY(ids))) AS pending
          FROM unnest(ids) AS r(id)) p
    WHERE s.id = p.id
    RETURNING s.id, s.run_id, s.project, s.pool, s.priority, s.ready_at, s.instance_count,
              s.state),
  queued AS (
    INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at,
                                      instance_count)
    SELECT run_id, id, project, pool, priority, ready_at, instance_count
    FROM updated WHERE state = 'ready')
  SELECT count(*) INTO n FROM (SELECT pg_notify('trnflow_ready', pool) FROM updated
                               WHERE state = 'ready' GROUP BY pool) x;
  SELECT count(*) INTO n FROM unnest(ids);
  UPDATE trnflow.runs SET state = 'running', finished_at = NULL, cancel_reason = NULL
  WHERE id = p_run AND state <> 'running';
  RETURN n;
END $$;
