-- A lighter submit (bench/analysis.md, "Submit").
--
-- Two foreign keys of `stages` were checked once per inserted stage, ~12 us each, a third of
-- the server's time to submit 10,000 stages: the run (inserted by the same call, the only
-- writer of stages) and the instance type. The ledger never deletes runs or stages (0014
-- dropped the attempts' and edges' keys for the same reason), and submit_run now checks the
-- instance types once per distinct type. The stages of a run get their ids before they are
-- inserted, so the edges are mapped without joining the new rows back to the input by name.
ALTER TABLE trnflow.stages DROP CONSTRAINT IF EXISTS stages_run_id_fkey;
ALTER TABLE trnflow.stages DROP CONSTRAINT IF EXISTS stages_instance_type_fkey;

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
  SELECT count(*) INTO queued
  FROM trnflow.runs r JOIN trnflow.stages s ON s.run_id = r.id
  WHERE r.project = p_project AND r.state = 'running'
    AND s.state IN ('blocked', 'ready', 'running', 'retry_wait');
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
  IF coalesce(array_length(p_dep_from, 1), 0) > 0 THEN
    INSERT INTO trnflow.stage_deps (stage_id, needs_id)
    SELECT ids[f], ids[t] FROM unnest(p_dep_from, p_dep_to) AS d(f, t);
  END IF;
  PERFORM pg_notify('trnflow_ready', pool)
  FROM (SELECT DISTINCT pool FROM unnest(p_pools, p_pending) AS x(pool, pending)
        WHERE pending = 0) x;
  RETURN v_run;
END $$;
