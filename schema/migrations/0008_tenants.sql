-- Tenants that cannot touch each other. Three kinds of login, from least to most trusted:
--   a member   reads its projects through row-level security and writes only through the
--              SECURITY DEFINER functions below, which check membership in SQL;
--   the daemon (scheduler, workers) claims, completes and appends to the ledger; no DDL, no
--              CREATEROLE, no DELETE/TRUNCATE/trigger control on the ledger, and it can only
--              close open attempts (column grants + attempts_closed_once);
--   the owner  owns the schema and runs `trnflow db migrate` and `trnflow project`; not used
--              at run time.
-- Role names are scoped to this catalog (its role prefix), so a grant in one catalog never
-- leaks into another on the same server, and every role carries a comment naming its catalog.

-- Project roles used to be server-wide (trnflow_project_NAME) and to read every table, present
-- and future. Take that away first, before this migration creates any table.
DO $$
DECLARE
  p text;
  old text;
BEGIN
  FOR p IN SELECT name FROM trnflow.projects LOOP
    old := 'trnflow_project_' || replace(p, '-', '_');
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = old) THEN
      EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA trnflow REVOKE SELECT ON TABLES FROM %I', old);
      EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA trnflow FROM %I', old);
    END IF;
  END LOOP;
END $$;

CREATE TABLE trnflow.settings (
  key    text PRIMARY KEY,
  value  text NOT NULL
);
-- The prefix of this catalog's roles: the database name when it is a plain short identifier
-- (the default catalog `trnflow` keeps trnflow_project_NAME and trnflow_reader), else a hash.
INSERT INTO trnflow.settings (key, value)
SELECT 'role_prefix', CASE WHEN current_database() ~ '^[a-z][a-z0-9_]{0,31}$'
                           THEN current_database()
                           ELSE 'tf' || left(md5(current_database()), 10) END;
INSERT INTO trnflow.settings (key, value) VALUES ('catalog_id', md5(random()::text || clock_timestamp()::text));

CREATE FUNCTION trnflow.role_name(suffix text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN octet_length(full_name) <= 63 THEN full_name
              ELSE left(full_name, 54) || '_' || left(md5(full_name), 8) END
  FROM (SELECT (SELECT value FROM trnflow.settings WHERE key = 'role_prefix') || '_' || suffix
          AS full_name) n
$$;
CREATE OR REPLACE FUNCTION trnflow.project_role(p text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT trnflow.role_name('project_' || replace(p, '-', '_'))
$$;
CREATE FUNCTION trnflow.project_writer_role(p text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT trnflow.role_name('project_' || replace(p, '-', '_') || '_write')
$$;
CREATE FUNCTION trnflow.daemon_role() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT trnflow.role_name('daemon') $$;
CREATE FUNCTION trnflow.reader_role() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT trnflow.role_name('reader') $$;

-- Whether `who` is (or is a member of) role `r`; false when r does not exist.
CREATE FUNCTION trnflow.has_role(who name, r text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r AND pg_has_role(who, oid, 'MEMBER'))
$$;

-- Creates (or adopts) one of this catalog's roles. A role of that name that belongs to another
-- catalog or to nobody is refused: adopting it would hand its members this catalog's rights.
CREATE FUNCTION trnflow.ensure_catalog_role(r text, what text, login boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  mark text := 'trnflow catalog ' || (SELECT value FROM trnflow.settings WHERE key = 'catalog_id')
               || ' (' || current_database() || '): ' || what;
  have text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
    EXECUTE format('CREATE ROLE %I %s', r, CASE WHEN login THEN 'LOGIN' ELSE 'NOLOGIN' END);
    EXECUTE format('COMMENT ON ROLE %I IS %L', r, mark);
    RETURN;
  END IF;
  SELECT d.description INTO have FROM pg_roles ro
  JOIN pg_shdescription d ON d.objoid = ro.oid AND d.classoid = 'pg_authid'::regclass
  WHERE ro.rolname = r;
  IF have IS DISTINCT FROM mark THEN
    RAISE EXCEPTION 'role "%" exists and does not belong to this catalog (%)', r,
      coalesce(have, 'no trnflow comment') USING ERRCODE = '42710',
      HINT = 'another catalog on this server uses the name; rename one database or drop the role';
  END IF;
END $$;

SELECT trnflow.ensure_catalog_role(trnflow.daemon_role(), 'daemon');
DO $$
BEGIN
  -- The reader of the default catalog was trnflow_reader, a server-wide role made by 0003;
  -- adopt it there, and take its grants away everywhere else.
  IF trnflow.reader_role() = 'trnflow_reader' AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trnflow_reader') THEN
    EXECUTE format('COMMENT ON ROLE trnflow_reader IS %L',
      'trnflow catalog ' || (SELECT value FROM trnflow.settings WHERE key = 'catalog_id')
      || ' (' || current_database() || '): reader');
  ELSIF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trnflow_reader') THEN
    REVOKE ALL ON ALL TABLES IN SCHEMA trnflow FROM trnflow_reader;
    REVOKE USAGE ON SCHEMA trnflow FROM trnflow_reader;
  END IF;
END $$;
SELECT trnflow.ensure_catalog_role(trnflow.reader_role(), 'reader');

-- Row-level security everywhere project data lives. Members see their projects; the reader
-- sees spend; the daemon sees and writes everything (its policies fold to `true`, so the hot
-- path pays nothing for them).
CREATE OR REPLACE FUNCTION trnflow.can_see_project(p text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT trnflow.has_role(current_user, trnflow.project_role(p))
      OR trnflow.has_role(current_user, trnflow.reader_role())
$$;

-- Project data that runs carry: the project on stages too, so claims can share a pool
-- between projects without a join.
ALTER TABLE trnflow.stages ADD COLUMN project text;
UPDATE trnflow.stages s SET project = r.project FROM trnflow.runs r WHERE r.id = s.run_id;
ALTER TABLE trnflow.stages ALTER COLUMN project SET NOT NULL;
DROP INDEX trnflow.stages_ready;
CREATE INDEX stages_ready ON trnflow.stages (pool, project, priority DESC, ready_at, id)
  WHERE state = 'ready';

ALTER TABLE trnflow.schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.schedule_fires ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.workers ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.artifacts ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.settings ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trnflow.schedules FOR SELECT
  USING (project <> '' AND trnflow.has_role(current_user, trnflow.project_role(project)));
CREATE POLICY visible ON trnflow.schedule_fires FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.schedules s WHERE s.name = schedule));
-- Workers hold no project data (host, pid, pools): everyone with access may see the fleet.
CREATE POLICY visible ON trnflow.workers FOR SELECT USING (true);
-- Cache entries: visible with the stage that built them.
CREATE POLICY visible ON trnflow.artifacts FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.stages s WHERE s.id = builder_stage));
CREATE POLICY visible ON trnflow.settings FOR SELECT USING (key = 'role_prefix');

-- Budgets and spend become per-project for members (they were reader-or-member before).
DO $$
DECLARE
  t text;
  d text := trnflow.daemon_role();
BEGIN
  FOREACH t IN ARRAY ARRAY['projects', 'runs', 'stages', 'stage_deps', 'attempts', 'events',
                           'pipelines', 'spend_rollup', 'budgets', 'run_budget_notices',
                           'schedules', 'schedule_fires', 'workers', 'artifacts', 'settings']
  LOOP
    EXECUTE format('CREATE POLICY daemon_all ON trnflow.%I TO %I USING (true) WITH CHECK (true)', t, d);
  END LOOP;
END $$;

-- Numbers that reach the engine are finite and in range (NaN compares above every number in
-- PostgreSQL, so an upper bound also refuses it).
ALTER TABLE trnflow.runs ADD CONSTRAINT runs_speed_range CHECK (speed > 0 AND speed <= 1e9);
ALTER TABLE trnflow.runs ADD CONSTRAINT runs_spot_rate_range
  CHECK (spot_rate_multiplier >= 0 AND spot_rate_multiplier <= 1e6);
ALTER TABLE trnflow.runs ADD CONSTRAINT runs_budget_range
  CHECK (budget_usd IS NULL OR (budget_usd > 0 AND budget_usd < 1e12));
ALTER TABLE trnflow.budgets ADD CONSTRAINT budgets_amount_range CHECK (amount_usd < 1e12);
ALTER TABLE trnflow.stages ADD CONSTRAINT stages_count_range CHECK (instance_count <= 1024);
ALTER TABLE trnflow.schedules ADD CONSTRAINT schedules_speed_range CHECK (speed > 0 AND speed <= 1e9);

-- The uid a project's jobs run as on every worker host (the sandbox switches to it). Numbers
-- from 200001 up unless a site maps a project to one of its own (`project add --job-uid`);
-- shared storage must agree on them.
CREATE SEQUENCE trnflow.project_job_uids START 200001;
ALTER TABLE trnflow.projects ADD COLUMN job_uid bigint NOT NULL
  DEFAULT nextval('trnflow.project_job_uids') UNIQUE CHECK (job_uid >= 1000 AND job_uid < 4294967294);

-- Quotas, refused at submit with the figure.
ALTER TABLE trnflow.projects ADD COLUMN max_stages_per_run int NOT NULL DEFAULT 250000
  CHECK (max_stages_per_run > 0);
ALTER TABLE trnflow.projects ADD COLUMN max_queued_stages int NOT NULL DEFAULT 1000000
  CHECK (max_queued_stages > 0);

-- Budget stops: each attempt of a budgeted run or project is claimed with a spend cap (what is
-- left once closed spend and the reservations of other open attempts are taken away), and
-- holds a reservation: its expected cost when the engine knows it, else its whole cap.
ALTER TABLE trnflow.attempts ADD COLUMN cap_usd numeric(18,6);
ALTER TABLE trnflow.attempts ADD COLUMN reserved_usd numeric(18,6);

-- Leadership: the scheduler that holds an EXCLUSIVE lock on this table in an open
-- transaction leads. Locking it needs UPDATE on it, which only the daemon has: members cannot
-- take it, as they could take any advisory lock.
CREATE TABLE trnflow.leader_lock ();

-- The ledger trigger folds closed attempts into the rollup as the table owner, so the daemon
-- needs no write access to the rollup.
ALTER FUNCTION trnflow.roll_up_attempts() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- The daemon's rights: read everything; write the stage life; open and close attempts.
DO $$
DECLARE d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA trnflow TO %I', d);
  EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA trnflow TO %I', d);
  EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA trnflow TO %I', d);
  EXECUTE format('GRANT INSERT, UPDATE ON trnflow.projects, trnflow.runs, trnflow.stages,
                  trnflow.stage_deps, trnflow.events, trnflow.pipelines, trnflow.workers,
                  trnflow.run_budget_notices, trnflow.schedules, trnflow.schedule_fires,
                  trnflow.artifacts, trnflow.instance_types, trnflow.prices TO %I', d);
  EXECUTE format('GRANT INSERT, UPDATE, DELETE ON trnflow.budgets TO %I', d);
  EXECUTE format('GRANT DELETE ON trnflow.artifacts, trnflow.schedules TO %I', d);
  EXECUTE format('GRANT UPDATE ON trnflow.leader_lock TO %I', d);
  -- The ledger: rows are opened by claims and closed once; never deleted or rewritten.
  EXECUTE format('GRANT INSERT ON trnflow.attempts TO %I', d);
  EXECUTE format('GRANT UPDATE (finished_at, sim_seconds, billed_seconds, outcome, progress_to,
                  cost_usd, wasted_usd, saved_usd, baseline_usd, message, cap_usd, reserved_usd)
                  ON trnflow.attempts TO %I', d);
END $$;

-- Who may act on a project: the daemon and the owner on any, a member through the project's
-- writer role. SECURITY DEFINER functions run as the owner, so they ask about session_user.
CREATE FUNCTION trnflow.may_write(p text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT trnflow.has_role(session_user, trnflow.daemon_role())
      OR session_user = (SELECT tableowner FROM pg_tables
                         WHERE schemaname = 'trnflow' AND tablename = 'runs')
      OR trnflow.has_role(session_user, trnflow.project_writer_role(p))
$$;

CREATE FUNCTION trnflow.require_write(p text, what text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT trnflow.may_write(p) THEN
    RAISE EXCEPTION 'permission denied: % in project "%" needs membership with write access', what, p
      USING ERRCODE = '42501',
      HINT = 'an administrator runs: trnflow project grant ' || p || ' ' || session_user || ' --write';
  END IF;
END $$;

-- Submit: the pipeline (stored once per text), the run and its stages, in one call. Stages
-- come as parallel arrays; needs as pairs of 1-based positions in them.
CREATE FUNCTION trnflow.submit_run(
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
  FROM trnflow.runs r JOIN trnflow.stages s ON s.run_id = r.id
  WHERE r.project = p_project AND r.state = 'running'
    AND s.state IN ('blocked', 'ready', 'running', 'retry_wait');
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
  FROM (SELECT DISTINCT pool FROM trnflow.stages s WHERE s.run_id = v_run AND state = 'ready') x;
  RETURN v_run;
END $$;

-- Cancel: stages not yet running end now; running ones are stopped by their workers, which
-- learn of it from the notify (and their next heartbeat). Only the daemon stops a run for its
-- budget.
CREATE FUNCTION trnflow.cancel_run(p_run bigint, p_reason text,
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
    UPDATE trnflow.stages SET state = 'cancelled', finished_at = now()
    WHERE run_id = p_run AND state IN ('blocked', 'ready', 'retry_wait');
    GET DIAGNOSTICS stages_cancelled = ROW_COUNT;
    PERFORM pg_notify('trnflow_cancel', p_run::text);
  END IF;
  SELECT count(*) INTO stages_running FROM trnflow.stages WHERE run_id = p_run AND state = 'running';
END $$;

-- Resume (p_stage NULL: the run's failed, cancelled and skipped stages) and retry (the named
-- stage, or every expansion of a matrix stage, and everything downstream). Reset stages start
-- again with fresh budgets; a retried stage also starts from scratch. Returns how many.
CREATE FUNCTION trnflow.reset_stages(p_run bigint, p_stage text) RETURNS int
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

-- Reserves budget for freshly claimed attempts (daemon only). Each gets a cap: what is left of
-- its run's budget and of its project's budget for the period, after closed spend and the
-- reservations of the other open attempts; and reserves its expected cost (NULL: unknown, so
-- the whole cap). Run and budget rows are locked first, so two claimers never hand out the
-- same dollars; each statement below then sees the other's committed reservations.
CREATE FUNCTION trnflow.reserve_budgets(p_stages bigint[], p_attempts int[], p_expected numeric[])
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
    SELECT att.id, att.run_id, r.project, r.budget_usd INTO a
    FROM trnflow.attempts att JOIN trnflow.runs r ON r.id = att.run_id
    WHERE att.stage_id = p_stages[i] AND att.attempt = p_attempts[i] AND att.outcome IS NULL;
    CONTINUE WHEN a.id IS NULL;
    PERFORM 1 FROM trnflow.runs WHERE id = a.run_id FOR UPDATE;
    PERFORM 1 FROM trnflow.budgets WHERE project = a.project FOR UPDATE;
    cap := NULL;
    held := 0;
    IF a.budget_usd IS NOT NULL THEN
      SELECT coalesce(sum(x.reserved_usd) FILTER (WHERE x.outcome IS NULL AND x.id <> a.id), 0),
             a.budget_usd - coalesce(sum(x.cost_usd) FILTER (WHERE x.outcome IS NOT NULL), 0)
      INTO held, run_left FROM trnflow.attempts x WHERE x.run_id = a.run_id;
      cap := run_left - held;
    END IF;
    SELECT bu.amount_usd, CASE WHEN bu.period = 'month'
                               THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                               ELSE '-infinity'::timestamptz END AS start
    INTO b FROM trnflow.budgets bu WHERE bu.project = a.project;
    IF b.amount_usd IS NOT NULL THEN
      SELECT b.amount_usd
             - coalesce((SELECT sum(cost_usd) FROM trnflow.spend_rollup
                         WHERE project = a.project AND day >= b.start::date), 0)
             - coalesce((SELECT sum(x.reserved_usd) FROM trnflow.attempts x
                         JOIN trnflow.runs r ON r.id = x.run_id
                         WHERE r.project = a.project AND r.state = 'running'
                           AND x.outcome IS NULL AND x.id <> a.id), 0)
      INTO proj_left;
      IF cap IS NULL OR proj_left < cap THEN
        held := coalesce((SELECT sum(x.reserved_usd) FROM trnflow.attempts x
                          JOIN trnflow.runs r ON r.id = x.run_id
                          WHERE r.project = a.project AND r.state = 'running'
                            AND x.outcome IS NULL AND x.id <> a.id), 0);
        cap := proj_left;
      END IF;
    END IF;
    CONTINUE WHEN cap IS NULL;
    cap := greatest(cap, 0);
    UPDATE trnflow.attempts SET cap_usd = cap,
           reserved_usd = CASE WHEN p_expected[i] IS NULL THEN cap ELSE least(cap, p_expected[i]) END
    WHERE id = a.id;
    stage_id := p_stages[i];
    cap_usd := cap;
    held_usd := held;
    RETURN NEXT;
  END LOOP;
END $$;

-- Members: read their projects (RLS), the hardware catalog, the views and the schema version;
-- write through the functions. Not the leader or migration locks, nor the catalog's id.
CREATE OR REPLACE FUNCTION trnflow.add_project(p text, members text[]) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE m text;
BEGIN
  PERFORM trnflow.ensure_project(p);
  FOREACH m IN ARRAY members LOOP
    PERFORM trnflow.grant_project(p, m, true);
  END LOOP;
  RETURN trnflow.project_role(p);
END $$;

CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r text := trnflow.project_role(p);
  w text := trnflow.project_writer_role(p);
BEGIN
  IF p !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'invalid project name "%"', p USING ERRCODE = '22023',
      HINT = 'use lowercase letters, digits and -, starting with a letter or digit';
  END IF;
  INSERT INTO trnflow.projects (name) VALUES (p) ON CONFLICT (name) DO NOTHING;
  PERFORM trnflow.ensure_catalog_role(r, 'project ' || p || ' (read)');
  PERFORM trnflow.ensure_catalog_role(w, 'project ' || p || ' (write)');
  EXECUTE format('GRANT %I TO %I', r, w);
  EXECUTE format('GRANT USAGE ON SCHEMA trnflow TO %I', r);
  EXECUTE format('GRANT SELECT ON trnflow.projects, trnflow.runs, trnflow.stages,
                  trnflow.stage_deps, trnflow.attempts, trnflow.events, trnflow.pipelines,
                  trnflow.spend_rollup, trnflow.budgets, trnflow.run_budget_notices,
                  trnflow.schedules, trnflow.schedule_fires, trnflow.workers, trnflow.artifacts,
                  trnflow.instance_types, trnflow.prices, trnflow.settings,
                  trnflow.schema_migrations,
                  trnflow.attempt_ledger, trnflow.stage_status, trnflow.run_status,
                  trnflow.spend_daily, trnflow.spend_by_stage, trnflow.spend_by_run,
                  trnflow.spend_by_instance, trnflow.spot_savings, trnflow.interruption_waste,
                  trnflow.cache_savings, trnflow.gpu_baseline TO %I', r);
  IF to_regclass('trnflow.cache_trust') IS NOT NULL THEN  -- from migration 0009 on
    EXECUTE format('GRANT SELECT ON trnflow.cache_trust TO %I', r);
  END IF;
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb,
                  float8, bigint, float8, numeric, text, boolean, text[], text[], text[], text[],
                  int[], text[], int[], jsonb[], int[], int[]), trnflow.cancel_run(bigint, text),
                  trnflow.reset_stages(bigint, text) TO %I', w);
END $$;

-- Gives a login role read (or read and write) access to a project, with the limits every
-- member role gets: a connection limit and statement and idle-transaction timeouts, so no
-- member can exhaust connections or hold locks the daemons need.
CREATE FUNCTION trnflow.grant_project(p text, member text, write boolean) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE role text;
BEGIN
  PERFORM trnflow.ensure_project(p);
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = member) THEN
    RAISE EXCEPTION 'there is no role "%" to add to project %', member, p USING ERRCODE = '42704',
      HINT = 'create the login role first: CREATE ROLE name LOGIN PASSWORD ...';
  END IF;
  IF member = trnflow.daemon_role() OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = member
                                                AND (rolsuper OR rolcreaterole OR rolbypassrls)) THEN
    RAISE EXCEPTION 'role "%" is privileged; members are ordinary login roles', member
      USING ERRCODE = '22023';
  END IF;
  role := CASE WHEN write THEN trnflow.project_writer_role(p) ELSE trnflow.project_role(p) END;
  EXECUTE format('GRANT %I TO %I', role, member);
  IF (SELECT rolconnlimit FROM pg_roles WHERE rolname = member) < 0 THEN
    EXECUTE format('ALTER ROLE %I CONNECTION LIMIT 16', member);
  END IF;
  EXECUTE format('ALTER ROLE %I IN DATABASE %I SET statement_timeout = %L', member, current_database(), '60s');
  EXECUTE format('ALTER ROLE %I IN DATABASE %I SET idle_in_transaction_session_timeout = %L', member, current_database(), '60s');
  EXECUTE format('ALTER ROLE %I IN DATABASE %I SET lock_timeout = %L', member, current_database(), '5s');
  RETURN role;
END $$;

-- Existing projects get their roles and grants anew (the old ones were server-wide and
-- read everything through SELECT ON ALL TABLES).
DO $$
DECLARE p text;
BEGIN
  FOR p IN SELECT name FROM trnflow.projects LOOP
    -- The default catalog keeps the names it had: adopt its roles.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = trnflow.project_role(p))
       AND trnflow.project_role(p) = 'trnflow_project_' || replace(p, '-', '_') THEN
      EXECUTE format('COMMENT ON ROLE %I IS %L', trnflow.project_role(p),
        'trnflow catalog ' || (SELECT value FROM trnflow.settings WHERE key = 'catalog_id')
        || ' (' || current_database() || '): project ' || p || ' (read)');
    END IF;
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- The reader: spend, nothing else (as 0003 granted to trnflow_reader, now to this catalog's).
DO $$
DECLARE r text := trnflow.reader_role();
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA trnflow TO %I', r);
  EXECUTE format('GRANT SELECT (name) ON trnflow.projects TO %I', r);
  EXECUTE format('GRANT SELECT (id, pipeline_id, project, state, created_at, finished_at) ON trnflow.runs TO %I', r);
  EXECUTE format('GRANT SELECT (id, name) ON trnflow.pipelines TO %I', r);
  EXECUTE format('GRANT SELECT (id, run_id, name, kind, state, attempts) ON trnflow.stages TO %I', r);
  EXECUTE format('GRANT SELECT (id, stage_id, run_id, attempt, worker_name, instance_type, instance_count, market,
                  price_usd_hour, on_demand_price_usd_hour, started_at, finished_at, sim_seconds,
                  billed_seconds, outcome, cost_usd, wasted_usd, saved_usd, baseline_usd) ON trnflow.attempts TO %I', r);
  EXECUTE format('GRANT SELECT ON trnflow.spend_rollup, trnflow.budgets, trnflow.schema_migrations TO %I', r);
  EXECUTE format('GRANT SELECT ON trnflow.attempt_ledger, trnflow.stage_status, trnflow.run_status,
                  trnflow.spend_daily, trnflow.spend_by_stage, trnflow.spend_by_run,
                  trnflow.spend_by_instance, trnflow.spot_savings, trnflow.interruption_waste,
                  trnflow.cache_savings, trnflow.gpu_baseline TO %I', r);
END $$;

-- Functions are callable by whom the grants above say, not by PUBLIC.
REVOKE EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb, float8, bigint,
  float8, numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[],
  int[], int[]), trnflow.cancel_run(bigint, text), trnflow.reset_stages(bigint, text),
  trnflow.reserve_budgets(bigint[], int[], numeric[]), trnflow.add_project(text, text[]),
  trnflow.ensure_project(text), trnflow.grant_project(text, text, boolean),
  trnflow.ensure_catalog_role(text, text, boolean) FROM PUBLIC;
DO $$
DECLARE d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb,
                  float8, bigint, float8, numeric, text, boolean, text[], text[], text[], text[],
                  int[], text[], int[], jsonb[], int[], int[]), trnflow.cancel_run(bigint, text),
                  trnflow.reset_stages(bigint, text), trnflow.reserve_budgets(bigint[], int[], numeric[])
                  TO %I', d);
END $$;
