-- Who gets the next slot (issue 45): weighted fair share that holds claim after claim, caps,
-- priorities and workers reserved for projects.
--
-- Before, a claim let each project with ready stages take turns, one stage per project per
-- round, and broke the tie of the first round by age: when slots freed one at a time every
-- claim was for one slot and went to the oldest ready stage, which was always the sweep's.
-- Now a pool is shared by running share: the next slot goes to the project furthest below its
-- weighted share of that pool, counted from what runs now (running_stages, every worker and
-- executor), then priority, then age. A claim of one slot and a claim of a hundred give the
-- same order.
--
--   - projects.weight (default 1, 0.01..1000): a project's share of a pool is proportional
--     to it. projects.max_running: at most this many of the project's stages run at once
--     (NULL: no cap; 0 holds the project). project_pool_caps: the same per pool.
--   - running_stages carries the pool and the instances (slots) each running stage holds, so
--     the share of a project in a pool is one index range (running_stages_share).
--   - stages.priority comes from the stage's spec (`priority:` on a pipeline or a stage,
--     -1000..1000, checked by stage_spec_problem), written by submit_run's body. It orders
--     stages within their project (and breaks ties between projects with equal shares); a
--     project cannot buy its way past another's share.
--   - lock_ready_stages takes the projects a worker serves (`trnflow worker --project`; NULL:
--     all), leaves capped projects at their cap (serialised per capped project by an advisory
--     lock, so two workers cannot both take its last place), and returns each candidate's
--     project's running slots in the pool and weight for ClaimReadyStages to order by.
--   - queue_position(stage): what `explain` says of a ready stage's place (the project's
--     share, cap, and about how many stages go first), for whoever may read the stage.

ALTER TABLE trnflow.projects
  ADD COLUMN weight numeric NOT NULL DEFAULT 1
    CONSTRAINT projects_weight_check CHECK (weight >= 0.01 AND weight <= 1000),
  ADD COLUMN max_running integer
    CONSTRAINT projects_max_running_check CHECK (max_running BETWEEN 0 AND 1000000);

CREATE TABLE trnflow.project_pool_caps (
  project     text NOT NULL REFERENCES trnflow.projects (name) ON DELETE CASCADE,
  pool        text NOT NULL,
  max_running integer NOT NULL CHECK (max_running BETWEEN 0 AND 1000000),
  PRIMARY KEY (project, pool)
);

ALTER TABLE trnflow.running_stages ADD COLUMN pool text, ADD COLUMN slots integer;
UPDATE trnflow.running_stages q SET pool = s.pool, slots = s.instance_count
FROM trnflow.stages s WHERE s.id = q.stage_id;
ALTER TABLE trnflow.running_stages ALTER COLUMN pool SET NOT NULL,
  ALTER COLUMN slots SET NOT NULL;
CREATE INDEX running_stages_share ON trnflow.running_stages (project, pool) INCLUDE (slots);

DO $$
DECLARE
  d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('GRANT SELECT ON trnflow.project_pool_caps TO %I', d);
END $$;

-- The body of submit_run (0022's, called by 0023's checks), whole, with each stage's priority
-- from its spec (checked by stage_spec_problem before this runs), on the stage and on its queue
-- row.
CREATE OR REPLACE FUNCTION trnflow.submit_run_0022(p_project text, p_pipeline text, p_spec_hash text, p_source text, p_params jsonb, p_speed double precision, p_seed bigint, p_spot_rate double precision, p_budget numeric, p_workdir text, p_retry_failed boolean, p_names text[], p_kinds text[], p_pools text[], p_types text[], p_counts integer[], p_markets text[], p_pending integer[], p_specs jsonb[], p_dep_from integer[], p_dep_to integer[]) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
  IF p_project !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
    RAISE EXCEPTION 'invalid project name "%"', p_project USING ERRCODE = '22023',
      HINT = 'use lowercase letters, digits, - and _, starting with a letter or digit';
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
                              instance_count, market, state, pending_needs, spec, ready_at,
                              priority)
  SELECT ids[ord], v_run, p_project, name, kind, pool, instance_type, instance_count, market,
         CASE WHEN pending = 0 THEN 'ready' ELSE 'blocked' END, pending, spec,
         CASE WHEN pending = 0 THEN now() END, coalesce((spec->>'priority')::int, 0)
  FROM unnest(p_names, p_kinds, p_pools, p_types, p_counts, p_markets, p_pending, p_specs)
    WITH ORDINALITY AS t(name, kind, pool, instance_type, instance_count, market, pending, spec, ord);
  INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at,
                                    instance_count)
  SELECT v_run, ids[ord], p_project, pool, coalesce((spec->>'priority')::int, 0), now(),
         instance_count
  FROM unnest(p_pools, p_counts, p_pending, p_specs)
    WITH ORDINALITY AS t(pool, instance_count, pending, spec, ord)
  WHERE pending = 0;
  IF coalesce(array_length(p_dep_from, 1), 0) > 0 THEN
    INSERT INTO trnflow.stage_deps (stage_id, needs_id)
    SELECT ids[f], ids[t] FROM unnest(p_dep_from, p_dep_to) AS d(f, t);
  END IF;
  PERFORM pg_notify('trnflow_ready', pool)
  FROM (SELECT DISTINCT pool FROM unnest(p_pools, p_pending) AS x(pool, pending)
        WHERE pending = 0) x;
  RETURN v_run;
END $_$;

-- The stage checks of 0023, whole, with `priority` (a whole number in -1000..1000) and
-- `estimate_s` (a run stage's, in 0..1e9 seconds; the worker reads it from 0033 on).
CREATE OR REPLACE FUNCTION trnflow.stage_spec_problem(name text, kind text, pool text, itype text,
                                                      cnt integer, market text, spec jsonb,
                                                      ipool text, accel text) RETURNS text
LANGUAGE sql STABLE AS $_$
  SELECT CASE
    WHEN trnflow.stage_name_problem(name) IS NOT NULL THEN trnflow.stage_name_problem(name)
    WHEN spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN 'its spec is not a JSON object'
    WHEN octet_length(spec::text) > (trnflow.submit_limits()).max_spec_bytes
      THEN 'its spec has ' || octet_length(spec::text) || ' bytes; at most '
           || (trnflow.submit_limits()).max_spec_bytes || ' are allowed'
    WHEN spec->>'name' IS DISTINCT FROM name OR spec->>'kind' IS DISTINCT FROM kind
      OR spec->>'instance' IS DISTINCT FROM itype OR spec->>'market' IS DISTINCT FROM market
      OR jsonb_typeof(spec->'count') IS DISTINCT FROM 'number'
      OR (spec->>'count')::numeric IS DISTINCT FROM cnt::numeric
      THEN 'its spec''s name, kind, instance, count and market are not the stage''s own'
    WHEN kind NOT IN ('run', 'train', 'compile', 'deploy', 'benchmark')
      THEN 'unknown kind ''' || kind || ''''
    WHEN market NOT IN ('on-demand', 'spot') THEN 'unknown market ''' || market || ''''
    WHEN cnt IS NULL OR cnt < 1 OR cnt > 512 THEN 'count ' || coalesce(cnt::text, 'NULL') || ' is not in 1..512'
    WHEN accel IS NULL THEN 'unknown instance type "' || itype || '" (see `trnflow instances`)'
    WHEN pool IS DISTINCT FROM ipool
      THEN 'pool ''' || coalesce(pool, '') || ''' is not ' || itype || '''s pool ''' || ipool || ''''
    WHEN kind = 'train' AND accel NOT IN ('trainium', 'gpu')
      THEN 'train stages run on Trainium (trn1, trn2) or GPU instances, not ' || itype
    WHEN kind IN ('deploy', 'benchmark') AND accel = 'none'
      THEN itype || ' has no accelerator to serve a model on'
    WHEN spec ? 'priority' AND (jsonb_typeof(spec->'priority') <> 'number'
      OR (spec->>'priority')::numeric NOT BETWEEN -1000 AND 1000
      OR (spec->>'priority')::numeric <> trunc((spec->>'priority')::numeric))
      THEN 'its priority is not a whole number in -1000..1000'
    -- The command.
    WHEN spec ? 'command' AND (jsonb_typeof(spec->'command') <> 'object'
      OR (spec->'command' ? 'argv' AND (jsonb_typeof(spec->'command'->'argv') <> 'array'
          OR jsonb_path_exists(spec->'command'->'argv', 'strict $[*] ? (@.type() != "string")')))
      OR (spec->'command' ? 'shell' AND jsonb_typeof(spec->'command'->'shell') <> 'boolean')
      OR (spec->'command' ? 'env' AND (jsonb_typeof(spec->'command'->'env') <> 'object'
          OR jsonb_path_exists(spec->'command'->'env', 'strict $.* ? (@.type() != "string")')))
      OR (spec->'command' ? 'secrets' AND (jsonb_typeof(spec->'command'->'secrets') <> 'array'
          OR jsonb_path_exists(spec->'command'->'secrets', 'strict $[*] ? (@.type() != "string")')))
      OR (spec->'command' ? 'outputs' AND jsonb_typeof(spec->'command'->'outputs') <> 'null'
          AND (jsonb_typeof(spec->'command'->'outputs') <> 'array'
               OR jsonb_path_exists(spec->'command'->'outputs', 'strict $[*] ? (@.type() != "string")')))
      OR (spec->'command' ? 'network' AND (jsonb_typeof(spec->'command'->'network') <> 'string'
          OR spec->'command'->>'network' NOT IN ('none', 'host'))))
      THEN 'its command is malformed (argv, env, secrets and outputs hold strings; network is none or host)'
    WHEN kind = 'run' AND coalesce(jsonb_array_length(CASE WHEN jsonb_typeof(spec->'command'->'argv') = 'array'
                                                          THEN spec->'command'->'argv' END), 0) = 0
      THEN 'a run stage needs a command'
    -- Simulated work.
    WHEN kind <> 'run' AND jsonb_typeof(spec->'workload') IS DISTINCT FROM 'object'
      THEN 'a ' || kind || ' stage needs its workload'
    WHEN spec ? 'workload' AND jsonb_typeof(spec->'workload') <> 'null' AND (
      jsonb_typeof(spec->'workload') <> 'object'
      OR spec->'workload'->>'kind' IS DISTINCT FROM kind
      OR jsonb_typeof(spec->'workload'->'model') IS DISTINCT FROM 'object'
      OR jsonb_path_exists(spec->'workload', 'lax $.** ? (@.type() == "number" && (@ < 0 || @ > 1e15))')
      OR trnflow.bad_number(spec->'workload'->'model'->'layers', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'model'->'hidden', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'model'->'heads', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'model'->'kv_heads', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'model'->'ffn', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'model'->'vocab', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'model'->'context', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'seq_len', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'input_tokens', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'output_tokens', 0, 2147483647, true, false)
      OR trnflow.bad_number(spec->'workload'->'tp', 1, 1024, true, true)
      OR trnflow.bad_number(spec->'workload'->'pp', 1, 1024, true, true)
      OR trnflow.bad_number(spec->'workload'->'batch', 1, 1024, true, true)
      OR trnflow.bad_number(spec->'workload'->'tp_degree', 1, 1024, true, true))
      THEN 'its workload is malformed (kind, model, and every figure finite, not negative and in range)'
    -- Policies.
    WHEN spec ? 'retry' AND (jsonb_typeof(spec->'retry') <> 'object'
      OR jsonb_typeof(spec->'retry'->'max_attempts') IS DISTINCT FROM 'number'
      OR (spec->'retry'->>'max_attempts')::numeric NOT BETWEEN 1 AND 100
      OR jsonb_typeof(spec->'retry'->'on') IS DISTINCT FROM 'array'
      OR jsonb_path_exists(spec->'retry'->'on',
           'strict $[*] ? (!(@ == "spot_interruption" || @ == "capacity_unavailable" || @ == "lost" || @ == "timeout" || @ == "infra_error"))')
      OR jsonb_typeof(spec->'retry'->'backoff') IS DISTINCT FROM 'object'
      OR NOT (spec->'retry'->'backoff' ?& ARRAY['initial_s', 'factor', 'max_s'])
      OR trnflow.bad_number(spec->'retry'->'backoff'->'initial_s', 0, 1e9, false, true)
      OR trnflow.bad_number(spec->'retry'->'backoff'->'max_s', 0, 1e9, false, true)
      OR trnflow.bad_number(spec->'retry'->'backoff'->'factor', 1, 100, false, true)
      OR jsonb_typeof(spec->'retry'->'max_interruptions') IS DISTINCT FROM 'number'
      OR (spec->'retry'->>'max_interruptions')::numeric NOT BETWEEN 0 AND 1000
      OR spec->'retry'->>'then' IS NULL OR spec->'retry'->>'then' NOT IN ('on-demand', 'fail'))
      THEN 'its retry policy is malformed'
    WHEN spec ? 'checkpoint' AND (jsonb_typeof(spec->'checkpoint') <> 'object'
      OR jsonb_typeof(spec->'checkpoint'->'every_s') IS DISTINCT FROM 'number'
      OR (spec->'checkpoint'->>'every_s')::numeric NOT BETWEEN 0 AND 1e9
      OR jsonb_typeof(spec->'checkpoint'->'on_notice') IS DISTINCT FROM 'boolean')
      THEN 'its checkpoint policy is malformed'
    WHEN spec ? 'timeout_s' AND (jsonb_typeof(spec->'timeout_s') <> 'number'
      OR (spec->>'timeout_s')::numeric NOT BETWEEN 0 AND 1e9)
      THEN 'its timeout is not a number of seconds in 0..1e9'
    -- `estimate:` (a command's, for its first budget reservation; 0033): what the parser takes.
    WHEN spec ? 'estimate_s' AND (kind <> 'run' OR jsonb_typeof(spec->'estimate_s') <> 'number'
      OR (spec->>'estimate_s')::numeric NOT BETWEEN 0 AND 1e9)
      THEN 'its estimate is not a number of seconds in 0..1e9 on a run stage'
    WHEN spec ? 'cache' AND jsonb_typeof(spec->'cache') <> 'boolean' THEN 'cache is not a boolean'
    WHEN (spec ? 'cache_key' AND jsonb_typeof(spec->'cache_key') <> 'string')
      OR (spec ? 'cache_inputs' AND jsonb_typeof(spec->'cache_inputs') <> 'string')
      THEN 'its cache key and inputs are not strings'
    -- A compile's key is the hash of its inputs, and its inputs are its own workload's graph:
    -- a key cannot name a graph the stage does not build (another project's, to poison it).
    WHEN coalesce(spec->>'cache_key', '') <> '' AND (kind <> 'compile'
      OR spec->>'cache_key' <> encode(sha256(convert_to(coalesce(spec->>'cache_inputs', ''), 'UTF8')), 'hex'))
      THEN 'its cache key is not the hash of its cache inputs (the catalog computes it; it cannot be chosen)'
    WHEN coalesce(spec->>'cache_key', '') <> ''
      AND NOT trnflow.cache_inputs_match(spec->>'cache_inputs', spec->'workload')
      THEN 'its cache inputs are not the graph its workload compiles'
  END
$_$;

-- The claim's walk of the queue (0022, 0024), with the projects a worker serves and the caps.
-- For each project with ready stages in the pool (skipping through the queue's index), lock
-- its first candidates in priority order, skipping rows other workers hold, at most as many as
-- its caps leave room for; return with each its project's running slots in the pool and its
-- weight. Capped projects are serialised by an advisory lock taken (in name order) before their
-- running stages are counted: the count is read by a later statement than the lock, so it sees
-- what the previous holder committed.
DROP FUNCTION trnflow.lock_ready_stages(text, integer, bigint, integer);
CREATE FUNCTION trnflow.lock_ready_stages(p_pool text, p_capacity int, p_run bigint, p_max int,
                                          p_projects text[])
RETURNS TABLE (o_row tid, o_stage bigint, o_project text, o_instance_count int, o_priority int,
               o_ready_at timestamptz, o_running int, o_weight float8)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
  v_projects text[];
BEGIN
  IF p_projects IS NULL THEN
    WITH RECURSIVE projects AS (
      (SELECT q.project FROM trnflow.ready_stages q
       WHERE q.pool = p_pool AND (p_run = 0 OR q.run_id = p_run)
       ORDER BY q.project LIMIT 1)
      UNION ALL
      SELECT (SELECT q.project FROM trnflow.ready_stages q
              WHERE q.pool = p_pool AND q.project > p.project AND (p_run = 0 OR q.run_id = p_run)
              ORDER BY q.project LIMIT 1)
      FROM projects p WHERE p.project IS NOT NULL)
    SELECT array_agg(project) INTO v_projects FROM projects WHERE project IS NOT NULL;
  ELSE
    SELECT array_agg(x ORDER BY x) INTO v_projects
    FROM unnest(p_projects) x
    WHERE EXISTS (SELECT 1 FROM trnflow.ready_stages q
                  WHERE q.pool = p_pool AND q.project = x AND (p_run = 0 OR q.run_id = p_run));
  END IF;
  IF v_projects IS NULL THEN
    RETURN;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('trnflow.project_cap'), hashtext(p.name))
  FROM trnflow.projects p
  WHERE p.name = ANY(v_projects)
    AND (p.max_running IS NOT NULL
         OR EXISTS (SELECT 1 FROM trnflow.project_pool_caps c
                    WHERE c.project = p.name AND c.pool = p_pool))
  ORDER BY p.name;
  RETURN QUERY
  WITH room AS (
    SELECT p.name AS project, p.weight::float8 AS weight,
           coalesce((SELECT sum(r.slots) FROM trnflow.running_stages r
                     WHERE r.project = p.name AND r.pool = p_pool), 0)::int AS running,
           least(p_capacity, coalesce(nullif(p_max, 0), p_capacity),
                 CASE WHEN p.max_running IS NULL THEN p_capacity
                      ELSE p.max_running - (SELECT count(*) FROM trnflow.running_stages r
                                            WHERE r.project = p.name)::int END,
                 coalesce((SELECT c.max_running
                                  - (SELECT count(*) FROM trnflow.running_stages r
                                     WHERE r.project = p.name AND r.pool = p_pool)::int
                           FROM trnflow.project_pool_caps c
                           WHERE c.project = p.name AND c.pool = p_pool), p_capacity)) AS room
    FROM trnflow.projects p
    WHERE p.name = ANY(v_projects))
  SELECT c.ctid, c.stage_id, c.project, c.instance_count, c.priority, c.ready_at, rm.running,
         rm.weight
  FROM room rm CROSS JOIN LATERAL (
    SELECT q.ctid, q.stage_id, q.project, q.instance_count, q.priority, q.ready_at
    FROM trnflow.ready_stages q
    WHERE q.pool = p_pool AND q.project = rm.project AND q.instance_count <= p_capacity
      AND (p_run = 0 OR q.run_id = p_run)
      AND (p_run <> 0 OR NOT EXISTS (SELECT 1 FROM trnflow.held_runs h WHERE h.run_id = q.run_id))
    ORDER BY q.priority DESC, q.ready_at, q.stage_id
    LIMIT greatest(rm.room, 0)
    FOR UPDATE OF q SKIP LOCKED) c;
END $$;
REVOKE ALL ON FUNCTION trnflow.lock_ready_stages(text, int, bigint, int, text[]) FROM PUBLIC;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.lock_ready_stages(text, int, bigint, int, text[]) TO %I',
                 trnflow.daemon_role());
END $$;

-- Where a ready stage stands, for `trnflow explain`: its project's running slots in the pool
-- and in all, its weight and caps, the project's own ready stages that go before it, and about
-- how many stages of other projects go first (each other project with ready stages in the
-- pool takes slots until its share reaches the one this stage will be claimed at, at most as
-- many as it has ready). Counts only: nothing of another project is named. For whoever may
-- read the stage's project (its members, the reader, the daemons and the owner); nothing for
-- anyone else, as if the stage did not exist.
CREATE FUNCTION trnflow.queue_position(p_stage bigint,
  OUT project text, OUT pool text, OUT weight float8, OUT running_in_pool int,
  OUT running int, OUT running_stages_in_pool int, OUT pool_running int, OUT max_running int,
  OUT pool_max_running int,
  OUT ahead_in_project int, OUT ahead_elsewhere int, OUT projects_waiting int)
RETURNS SETOF record
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
  s record;
  v_share float8;
BEGIN
  IF p_stage IS NULL OR p_stage < 1 THEN
    RETURN;
  END IF;
  SELECT x.id, x.project, x.pool, x.priority, x.ready_at, x.state INTO s
  FROM trnflow.stages x WHERE x.id = p_stage;
  IF s.id IS NULL OR s.state <> 'ready'
     OR NOT (trnflow.has_role(session_user, trnflow.project_role(s.project))
             OR trnflow.has_role(session_user, trnflow.reader_role())
             OR trnflow.may_write(s.project)) THEN
    RETURN;
  END IF;
  project := s.project;
  pool := s.pool;
  SELECT p.weight::float8, p.max_running INTO weight, max_running
  FROM trnflow.projects p WHERE p.name = s.project;
  SELECT c.max_running INTO pool_max_running
  FROM trnflow.project_pool_caps c WHERE c.project = s.project AND c.pool = s.pool;
  SELECT coalesce(sum(r.slots), 0)::int INTO running_in_pool
  FROM trnflow.running_stages r WHERE r.project = s.project AND r.pool = s.pool;
  SELECT count(*)::int INTO running FROM trnflow.running_stages r WHERE r.project = s.project;
  SELECT count(*)::int INTO running_stages_in_pool
  FROM trnflow.running_stages r WHERE r.project = s.project AND r.pool = s.pool;
  SELECT coalesce(sum(r.slots), 0)::int INTO pool_running
  FROM trnflow.running_stages r WHERE r.pool = s.pool;
  SELECT count(*)::int, coalesce(sum(q.instance_count), 0)::float8
  INTO ahead_in_project, v_share
  FROM trnflow.ready_stages q
  WHERE q.pool = s.pool AND q.project = s.project
    AND (q.priority, -extract(epoch FROM q.ready_at), -q.stage_id)
        > (s.priority, -extract(epoch FROM s.ready_at), -s.id);
  v_share := (running_in_pool + v_share) / weight;
  SELECT coalesce(sum(least(o.ready, greatest(0, ceil(v_share * o.weight - o.running)))), 0)::int,
         count(*)::int
  INTO ahead_elsewhere, projects_waiting
  FROM (SELECT p.name, p.weight::float8 AS weight,
               (SELECT count(*) FROM trnflow.ready_stages q
                WHERE q.pool = s.pool AND q.project = p.name) AS ready,
               (SELECT coalesce(sum(r.slots), 0) FROM trnflow.running_stages r
                WHERE r.project = p.name AND r.pool = s.pool) AS running
        FROM trnflow.projects p
        WHERE p.name <> s.project
          AND EXISTS (SELECT 1 FROM trnflow.ready_stages q
                      WHERE q.pool = s.pool AND q.project = p.name)) o;
  RETURN NEXT;
END $$;

-- The projects a worker is reserved for (`trnflow worker --project`; NULL: every project), for
-- `workers` and `explain`.
ALTER TABLE trnflow.workers ADD COLUMN projects text[];
