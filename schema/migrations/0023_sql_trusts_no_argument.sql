-- SQL trusts no argument (issue 32, parts 3 and 6; docs/security.md).
--
-- Members write only through SECURITY DEFINER functions, and those stored what they were given:
-- a stage named `..`, a training billed as a c6i.large (the stage row's instance type is what
-- the claim prices; the spec's is what the simulator runs), a speed that makes compute free,
-- 94 MB in one call, a compile cache key naming another project's graph, and a quota raced by
-- concurrent submits. Here every argument is checked as the parser checks it, the quota is
-- counted under a lock on the project's row, the ledger gets CHECK constraints, the daemons'
-- role stops inheriting the member roles it is granted, and job uids come from a range this
-- catalog claims on the server.
--
-- Errors: 22023 (bad input, exit 2) naming the stage and what is wrong; TF001 (refused, exit 4)
-- for quotas and sizes, as before.

-- Limits, in one place (docs/security.md, "Arguments").
CREATE FUNCTION trnflow.submit_limits(OUT max_name_bytes int, OUT max_spec_bytes int,
  OUT max_source_bytes int, OUT max_params_bytes int, OUT max_call_bytes bigint,
  OUT min_speed float8, OUT max_speed float8)
LANGUAGE sql IMMUTABLE AS $$
  SELECT 255, 256 * 1024, 4 * 1024 * 1024, 256 * 1024, 32::bigint * 1024 * 1024, 0.001::float8,
         1e9::float8
$$;

-- A stage name as the parser makes them: a base name (letters, digits, '-', '_', at most 63,
-- starting with a letter or digit), and for a matrix expansion `[key=value,...]` whose values
-- hold no '/' and no control character; at most 255 bytes (it names files on workers). This
-- also refuses '', '.', '..' and anything with NUL (which text cannot hold anyway).
CREATE FUNCTION trnflow.stage_name_problem(n text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN n IS NULL OR n = '' THEN 'a stage name is empty'
    WHEN octet_length(n) > 255 THEN 'a stage name is longer than 255 bytes'
    WHEN n ~ '[\x01-\x1f\x7f]' THEN 'a stage name holds a control character'
    WHEN position('/' IN n) > 0 THEN 'a stage name holds ''/'''
    WHEN n !~ '^[A-Za-z0-9][A-Za-z0-9_-]{0,62}(\[.*\])?$'
      THEN 'invalid stage name ''' || n || ''' (letters, digits, ''-'' and ''_'', starting with a letter or digit, then an optional [matrix=values])'
  END
$$;

-- Whether a JSON value is not a number in [lo, hi] (integral when `integral`); absent or null
-- counts as bad only when `required`. Plain expressions (no subquery), so they are inlined: the
-- per-stage check costs microseconds, not the tens a subquery's set-up costs per call.
CREATE FUNCTION trnflow.bad_number(v jsonb, lo numeric, hi numeric, integral boolean,
                                   required boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN v IS NULL OR jsonb_typeof(v) = 'null' THEN required
              WHEN jsonb_typeof(v) <> 'number' THEN true
              ELSE v::numeric NOT BETWEEN lo AND hi OR (integral AND v::numeric <> trunc(v::numeric))
         END
$$;

-- A compile's cache inputs are the graph its own workload compiles (pipelines/parser.cpp,
-- CompileCacheInputs): the same model, shapes, target and flags. Inputs that are not JSON
-- raise 22P02 (refused, nothing written; the parser never writes them). No subquery: a
-- subquery's set-up per call cost ~45 us a stage; the inputs are parsed once.
CREATE FUNCTION trnflow.cache_inputs_match(inputs text, w jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE ci jsonb := inputs::jsonb;
BEGIN
  RETURN coalesce(jsonb_typeof(ci) = 'object' AND jsonb_typeof(w) = 'object'
     AND ci->'model' = w->'model' AND ci->'batch' = w->'batch'
     AND ci->'seq_len' = w->'seq_len' AND ci->'dtype' = w->'dtype'
     AND ci->'tp_degree' = w->'tp_degree' AND ci->'target' = w->'target'
     AND jsonb_typeof(ci->'compiler_flags') = 'array'
     AND jsonb_typeof(w->'compiler_flags') = 'array'
     AND (ci->'compiler_flags') @> (w->'compiler_flags')
     AND (w->'compiler_flags') @> (ci->'compiler_flags'), false);
END $$;

-- What is wrong with one stage of a submission, or NULL. Mirrors StageSpecFromJson
-- (common/stage_spec.cpp) and the parser's rules (pipelines/parser.cpp, sim/feasibility.cpp):
-- the row's columns must be the spec's own fields, the pool and instance must be the catalog's,
-- and the instance must suit the kind. `accel`/`ipool` are the instance type's catalog row
-- (NULL: not in the catalog).
CREATE FUNCTION trnflow.stage_spec_problem(name text, kind text, pool text, itype text,
  cnt int, market text, spec jsonb, ipool text, accel text) RETURNS text
LANGUAGE sql STABLE AS $$
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
$$;

-- Submitting: every argument checked, then the quota counted under a lock on the project's row
-- (FOR NO KEY UPDATE: concurrent submits to one project take turns; foreign-key checks on the
-- row do not wait). The body is 0022's, renamed.
ALTER FUNCTION trnflow.submit_run(text, text, text, text, jsonb, float8, bigint, float8, numeric,
  text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[], int[], int[])
  RENAME TO submit_run_0022;

CREATE FUNCTION trnflow.submit_run(
  p_project text, p_pipeline text, p_spec_hash text, p_source text, p_params jsonb,
  p_speed float8, p_seed bigint, p_spot_rate float8, p_budget numeric, p_workdir text,
  p_retry_failed boolean, p_names text[], p_kinds text[], p_pools text[], p_types text[],
  p_counts int[], p_markets text[], p_pending int[], p_specs jsonb[], p_dep_from int[],
  p_dep_to int[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  lim record := trnflow.submit_limits();
  n int := coalesce(array_length(p_names, 1), 0);
  e int := coalesce(array_length(p_dep_from, 1), 0);
  bytes bigint;
  bad record;
BEGIN
  PERFORM trnflow.require_write(p_project, 'submitting a run');
  -- The run's own arguments.
  IF p_speed IS NULL OR NOT (p_speed BETWEEN lim.min_speed AND lim.max_speed) THEN
    RAISE EXCEPTION 'speed % is not in [%, %]', p_speed, lim.min_speed, lim.max_speed
      USING ERRCODE = '22023', HINT = '--speed takes a number from 0.001 to 1e9';
  END IF;
  IF p_pipeline IS NULL OR p_pipeline !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'invalid pipeline name "%"', left(p_pipeline, 80) USING ERRCODE = '22023',
      HINT = 'use lowercase letters, digits and -, starting with a letter or digit (at most 63)';
  END IF;
  IF p_spec_hash IS NULL OR p_spec_hash !~ '^[0-9A-Za-z_-]{1,128}$' THEN
    RAISE EXCEPTION 'invalid pipeline hash' USING ERRCODE = '22023';
  END IF;
  IF p_workdir IS NOT NULL AND (octet_length(p_workdir) > 4096 OR p_workdir ~ '[\x01-\x1f\x7f]') THEN
    RAISE EXCEPTION 'invalid workdir: longer than 4096 bytes or holds a control character'
      USING ERRCODE = '22023';
  END IF;
  IF p_params IS NOT NULL AND jsonb_typeof(p_params) <> 'object' THEN
    RAISE EXCEPTION 'params must be a JSON object' USING ERRCODE = '22023';
  END IF;
  -- Sizes, before anything looks inside.
  IF octet_length(p_source) > lim.max_source_bytes THEN
    RAISE EXCEPTION 'the pipeline file has % bytes; at most % are stored', octet_length(p_source),
      lim.max_source_bytes USING ERRCODE = 'TF001', HINT = 'split the pipeline';
  END IF;
  IF octet_length(p_params::text) > lim.max_params_bytes THEN
    RAISE EXCEPTION 'the params have % bytes; at most % are stored', octet_length(p_params::text),
      lim.max_params_bytes USING ERRCODE = 'TF001';
  END IF;
  SELECT coalesce(sum(octet_length(s::text)), 0) INTO bytes FROM unnest(p_specs) AS u(s);
  bytes := bytes + coalesce(octet_length(p_source), 0) + coalesce(octet_length(p_params::text), 0);
  IF bytes > lim.max_call_bytes THEN
    RAISE EXCEPTION 'the run has % bytes of stage specs and source; at most % are stored per run',
      bytes, lim.max_call_bytes USING ERRCODE = 'TF001', HINT = 'split the sweep into several runs';
  END IF;
  -- One entry per stage in every array; edges between stages of this run, counted in pending.
  IF coalesce(array_length(p_kinds, 1), 0) <> n OR coalesce(array_length(p_pools, 1), 0) <> n
     OR coalesce(array_length(p_types, 1), 0) <> n OR coalesce(array_length(p_counts, 1), 0) <> n
     OR coalesce(array_length(p_markets, 1), 0) <> n OR coalesce(array_length(p_pending, 1), 0) <> n
     OR coalesce(array_length(p_specs, 1), 0) <> n OR coalesce(array_length(p_dep_to, 1), 0) <> e THEN
    RAISE EXCEPTION 'the stage arrays have different lengths' USING ERRCODE = '22023';
  END IF;
  IF e > 0 AND EXISTS (SELECT 1 FROM unnest(p_dep_from, p_dep_to) AS d(f, t)
                       WHERE f IS NULL OR t IS NULL OR f NOT BETWEEN 1 AND n
                          OR t NOT BETWEEN 1 AND n OR f = t) THEN
    RAISE EXCEPTION 'a dependency names no stage of the run' USING ERRCODE = '22023';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(p_pending) WITH ORDINALITY AS p(pending, ord)
             LEFT JOIN (SELECT f, count(*) AS needs FROM unnest(p_dep_from) AS d(f) GROUP BY f) c
               ON c.f = p.ord
             WHERE p.pending IS DISTINCT FROM coalesce(c.needs, 0)) THEN
    RAISE EXCEPTION 'a stage''s pending count is not the number of its needs' USING ERRCODE = '22023';
  END IF;
  IF (SELECT count(DISTINCT x) FROM unnest(p_names) AS u(x)) <> n THEN
    RAISE EXCEPTION 'two stages of the run have one name' USING ERRCODE = '22023';
  END IF;
  -- Each stage, as the parser would have it.
  SELECT t.ord, t.name, trnflow.stage_spec_problem(t.name, t.kind, t.pool, t.itype, t.cnt,
                                                   t.market, t.spec, i.pool, i.accelerator) AS why
  INTO bad
  FROM unnest(p_names, p_kinds, p_pools, p_types, p_counts, p_markets, p_specs)
         WITH ORDINALITY AS t(name, kind, pool, itype, cnt, market, spec, ord)
  LEFT JOIN trnflow.instance_types i ON i.name = t.itype
  WHERE trnflow.stage_spec_problem(t.name, t.kind, t.pool, t.itype, t.cnt, t.market, t.spec,
                                   i.pool, i.accelerator) IS NOT NULL
  ORDER BY t.ord LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'stage % (''%''): %', bad.ord,
      left(regexp_replace(coalesce(bad.name, ''), '[\x01-\x1f\x7f]', '?', 'g'), 80), bad.why
      USING ERRCODE = '22023',
      HINT = 'submit the pipeline through `trnflow submit`, which validates it as `trnflow validate` does';
  END IF;
  -- The quota is counted (in submit_run_0022) while this transaction holds the project's row:
  -- a concurrent submit to the project waits here until this one commits, then counts it.
  PERFORM 1 FROM trnflow.projects WHERE name = p_project FOR NO KEY UPDATE;
  RETURN trnflow.submit_run_0022(p_project, p_pipeline, p_spec_hash, p_source, p_params, p_speed,
    p_seed, p_spot_rate, p_budget, p_workdir, p_retry_failed, p_names, p_kinds, p_pools, p_types,
    p_counts, p_markets, p_pending, p_specs, p_dep_from, p_dep_to);
END $$;

-- Retry takes a stage name: the same rule, and no LIKE pattern (a '_' or '%' in it matched
-- other stages).
ALTER FUNCTION trnflow.reset_stages(bigint, text) RENAME TO reset_stages_0022;
CREATE FUNCTION trnflow.reset_stages(p_run bigint, p_stage text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE why text;
BEGIN
  IF p_stage IS NOT NULL THEN
    why := trnflow.stage_name_problem(p_stage);
    IF why IS NOT NULL THEN
      RAISE EXCEPTION '%', why USING ERRCODE = '22023';
    END IF;
    IF p_stage ~ '[%_\\]' AND NOT EXISTS (
         SELECT 1 FROM trnflow.stages WHERE run_id = p_run
           AND (name = p_stage OR left(name, length(p_stage) + 1) = p_stage || '[')) THEN
      RAISE EXCEPTION 'run % has no stage ''%''; `trnflow show %` lists them', p_run, p_stage, p_run
        USING ERRCODE = 'TF002';
    END IF;
  END IF;
  RETURN trnflow.reset_stages_0022(p_run, p_stage);
END $$;

-- Only the wrappers are callable: the old bodies are the owner's (the wrappers run as it).
REVOKE EXECUTE ON FUNCTION trnflow.submit_run_0022(text, text, text, text, jsonb, float8, bigint,
  float8, numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[],
  int[], int[]), trnflow.reset_stages_0022(bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb, float8, bigint,
  float8, numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[],
  int[], int[]), trnflow.reset_stages(bigint, text) FROM PUBLIC;
DO $$
DECLARE
  g text;
  p text;
BEGIN
  FOR g IN SELECT trnflow.daemon_role()
           UNION SELECT trnflow.project_writer_role(name) FROM trnflow.projects LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = g) THEN CONTINUE; END IF;
    EXECUTE format('REVOKE EXECUTE ON FUNCTION trnflow.submit_run_0022(text, text, text, text,
                    jsonb, float8, bigint, float8, numeric, text, boolean, text[], text[], text[],
                    text[], int[], text[], int[], jsonb[], int[], int[]),
                    trnflow.reset_stages_0022(bigint, text) FROM %I', g);
    EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb,
                    float8, bigint, float8, numeric, text, boolean, text[], text[], text[], text[],
                    int[], text[], int[], jsonb[], int[], int[]),
                    trnflow.reset_stages(bigint, text) TO %I', g);
  END LOOP;
END $$;

-- The ledger: what the daemons' login may write is bounded too (it inserted a negative cost).
ALTER TABLE trnflow.attempts
  ADD CONSTRAINT attempts_cost_bounded CHECK (cost_usd >= 0 AND cost_usd < 1e9) NOT VALID,
  ADD CONSTRAINT attempts_wasted_bounded CHECK (wasted_usd >= 0 AND wasted_usd < 1e9) NOT VALID,
  ADD CONSTRAINT attempts_reserved_bounded CHECK (reserved_usd >= 0 AND reserved_usd < 1e12
                                                  AND cap_usd >= 0 AND cap_usd < 1e12) NOT VALID,
  ADD CONSTRAINT attempts_time_bounded CHECK (sim_seconds >= 0 AND sim_seconds < 1e12
                                              AND billed_seconds >= 0 AND billed_seconds < 1e12) NOT VALID,
  ADD CONSTRAINT attempts_price_bounded CHECK (price_usd_hour >= 0 AND price_usd_hour < 1e6) NOT VALID;
ALTER TABLE trnflow.attempts VALIDATE CONSTRAINT attempts_cost_bounded;
ALTER TABLE trnflow.attempts VALIDATE CONSTRAINT attempts_wasted_bounded;
ALTER TABLE trnflow.attempts VALIDATE CONSTRAINT attempts_reserved_bounded;
ALTER TABLE trnflow.attempts VALIDATE CONSTRAINT attempts_time_bounded;
ALTER TABLE trnflow.attempts VALIDATE CONSTRAINT attempts_price_bounded;

-- The daemons' role is granted every member's login role so the dashboard can `SET ROLE` to
-- it (0013). Granted, not inherited: the daemons' own privileges are their own grants, and a
-- member's (in this catalog or another one on the server) reach them only under SET ROLE,
-- which only the dashboard does, per request, for a person the proxy named.
DO $$
BEGIN
  EXECUTE format('ALTER ROLE %I NOINHERIT', trnflow.daemon_role());
END $$;

-- A member blocking the daemons: the scheduler ends the session of a member whose lock a
-- daemon has waited on for longer than `p_after_s` (a member can SET its own timeouts to
-- nothing, so theirs do not protect the daemons). The daemons' role may end a member's
-- session only as that member (it is granted every member's role; `SET ROLE` lets it signal
-- the member's own backends, as the member could), not through pg_signal_backend, which
-- would let it end any session on the server. Returns the sessions ended.
CREATE FUNCTION trnflow.end_member_blockers(p_after_s float8)
RETURNS TABLE (pid int, member text, waited_s float8)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
  me text := session_user;
BEGIN
  FOR r IN
    SELECT DISTINCT b.blocker, a.usename::text AS who,
           extract(epoch FROM now() - w.since)::float8 AS waited
    FROM (SELECT l.pid, min(l.waitstart) AS since FROM pg_locks l
          WHERE NOT l.granted AND l.waitstart IS NOT NULL GROUP BY l.pid) w
    JOIN pg_stat_activity d ON d.pid = w.pid
    CROSS JOIN LATERAL unnest(pg_blocking_pids(d.pid)) AS b(blocker)
    JOIN pg_stat_activity a ON a.pid = b.blocker
    WHERE d.usename = me AND d.datname = current_database()
      AND w.since < now() - make_interval(secs => p_after_s)
      AND a.usename IS NOT NULL AND a.usename <> me
      AND pg_has_role(me, a.usename, 'MEMBER')
      AND NOT EXISTS (SELECT 1 FROM pg_roles ro WHERE ro.rolname = a.usename
                      AND (ro.rolsuper OR ro.rolcreaterole OR ro.rolbypassrls))
  LOOP
    PERFORM set_config('role', r.who, true);
    IF pg_terminate_backend(r.blocker) THEN
      pid := r.blocker;
      member := r.who;
      waited_s := r.waited;
      RETURN NEXT;
    END IF;
    PERFORM set_config('role', 'none', true);
  END LOOP;
  PERFORM set_config('role', 'none', true);
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.end_member_blockers(float8) FROM PUBLIC;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.end_member_blockers(float8) TO %I',
                 trnflow.daemon_role());
END $$;

-- Job uids (issue 32, part 6): each catalog hands its projects uids from its own range, claimed
-- on the server by a role named after the range's start (`trnflow_job_uids_<start>`, commented
-- with the catalog and the range, dropped with the catalog's roles), so two catalogs on one
-- server are never given overlapping ranges: a range that overlaps another catalog's claim is
-- refused. Default: the first free block of 100,000 from 200000-299999, preferring the block
-- this catalog's projects already use. `trnflow db migrate --job-uid-range START-END` sets it.
CREATE FUNCTION trnflow.job_uid_range(OUT lo bigint, OUT hi bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT split_part(value, '-', 1)::bigint, split_part(value, '-', 2)::bigint
  FROM trnflow.settings WHERE key = 'job_uid_range'
$$;

-- Other catalogs' claims on this server: (catalog, lo, hi).
CREATE FUNCTION trnflow.job_uid_claims(OUT owner text, OUT lo bigint, OUT hi bigint,
                                       OUT mine boolean)
RETURNS SETOF record LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT m[1], m[2]::bigint, m[3]::bigint,
         m[1] = 'trnflow catalog ' || (SELECT value FROM trnflow.settings WHERE key = 'catalog_id')
                || ' (' || current_database() || ')'
  FROM pg_roles r
  JOIN pg_shdescription d ON d.objoid = r.oid AND d.classoid = 'pg_authid'::regclass
  CROSS JOIN LATERAL regexp_match(d.description, '^(trnflow catalog .*): job uids ([0-9]+)-([0-9]+)$') m
  WHERE r.rolname LIKE 'trnflow\_job\_uids\_%' AND m IS NOT NULL
    -- A claim outlives its catalog only if the catalog's roles were never dropped: one whose
    -- database is gone claims nothing.
    AND EXISTS (SELECT 1 FROM pg_database db
                WHERE db.datname = substring(m[1] FROM '\(([^()]*)\)$'))
$$;

CREATE FUNCTION trnflow.set_job_uid_range(p_lo bigint, p_hi bigint,
                                          p_keep_outside boolean DEFAULT false) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  me text := 'trnflow catalog ' || (SELECT value FROM trnflow.settings WHERE key = 'catalog_id')
             || ' (' || current_database() || ')';
  other record;
  outside text;
  old record;
BEGIN
  -- Below 2^31: the job's namespaces (bubblewrap) map its uid, and cannot map larger ones.
  IF p_lo IS NULL OR p_hi IS NULL OR p_lo < 1000 OR p_hi > 2147483646 OR p_hi < p_lo THEN
    RAISE EXCEPTION 'job uid range %-% is not within 1000-2147483646 (START <= END)', p_lo, p_hi
      USING ERRCODE = '22023', HINT = 'e.g. --job-uid-range 200000-299999';
  END IF;
  SELECT * INTO other FROM trnflow.job_uid_claims() c
  WHERE NOT c.mine AND c.lo <= p_hi AND p_lo <= c.hi LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'job uid range %-% overlaps %-% of %', p_lo, p_hi, other.lo, other.hi, other.owner
      USING ERRCODE = '22023', HINT = 'two catalogs on one server must not share job uids; choose another range';
  END IF;
  SELECT string_agg(name || ' (' || job_uid || ')', ', ' ORDER BY name) INTO outside
  FROM trnflow.projects WHERE job_uid NOT BETWEEN p_lo AND p_hi;
  IF outside IS NOT NULL AND NOT p_keep_outside THEN
    RAISE EXCEPTION 'projects of this catalog have job uids outside %-%: %', p_lo, p_hi, outside
      USING ERRCODE = '22023',
      HINT = 'choose a range that holds them, or renumber them first (trnflow project add NAME --job-uid N)';
  END IF;
  FOR old IN SELECT r.rolname FROM pg_roles r
             JOIN pg_shdescription d ON d.objoid = r.oid AND d.classoid = 'pg_authid'::regclass
             WHERE r.rolname LIKE 'trnflow\_job\_uids\_%' AND d.description LIKE me || ': job uids %' LOOP
    EXECUTE format('DROP ROLE %I', old.rolname);
  END LOOP;
  -- A stale claim of this start (its catalog's database is gone) is dropped.
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trnflow_job_uids_' || p_lo)
     AND NOT EXISTS (SELECT 1 FROM trnflow.job_uid_claims() c WHERE c.lo = p_lo) THEN
    EXECUTE format('DROP ROLE %I', 'trnflow_job_uids_' || p_lo);
  END IF;
  BEGIN
    EXECUTE format('CREATE ROLE %I NOLOGIN', 'trnflow_job_uids_' || p_lo);
  EXCEPTION WHEN duplicate_object THEN
    RAISE EXCEPTION 'job uid range starting at % is claimed by another catalog on this server', p_lo
      USING ERRCODE = '22023', HINT = 'choose another range';
  END;
  EXECUTE format('COMMENT ON ROLE %I IS %L', 'trnflow_job_uids_' || p_lo,
                 me || ': job uids ' || p_lo || '-' || p_hi);
  INSERT INTO trnflow.settings (key, value) VALUES ('job_uid_range', p_lo || '-' || p_hi)
  ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
  IF outside IS NOT NULL THEN
    RAISE WARNING 'projects of this catalog keep job uids outside its range %-%: % (renumber them: docs/operations.md)',
      p_lo, p_hi, outside;
  END IF;
  RETURN p_lo || '-' || p_hi;
END $$;

-- The default: the first block of 100,000 no other catalog claims, preferring the block this
-- catalog's projects already use (200000-299999 for one numbered by 0008's sequence).
CREATE FUNCTION trnflow.claim_default_job_uid_range() RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  lo bigint;
  used_lo bigint;
  used_hi bigint;
BEGIN
  IF (trnflow.job_uid_range()).lo IS NOT NULL THEN
    RETURN (SELECT value FROM trnflow.settings WHERE key = 'job_uid_range');
  END IF;
  SELECT min(job_uid), max(job_uid) INTO used_lo, used_hi FROM trnflow.projects;
  IF used_lo IS NOT NULL AND used_lo >= 100000 AND used_hi < (used_lo / 100000) * 100000 + 100000 THEN
    BEGIN
      RETURN trnflow.set_job_uid_range((used_lo / 100000) * 100000, (used_lo / 100000) * 100000 + 99999);
    EXCEPTION WHEN invalid_parameter_value THEN
      NULL;  -- another catalog claims it: a free block for new projects below
    END;
  END IF;
  FOR i IN 0 .. 40000 LOOP
    lo := 200000 + i::bigint * 100000;
    EXIT WHEN lo + 99999 > 2147483646;
    BEGIN
      RETURN trnflow.set_job_uid_range(lo, lo + 99999, true);
    EXCEPTION WHEN invalid_parameter_value THEN
      NULL;  -- claimed by another catalog: the next block
    END;
  END LOOP;
  RAISE EXCEPTION 'no free block of 100,000 job uids on this server' USING ERRCODE = '22023';
END $$;

-- New projects get the next free uid of the range; a chosen one (`project add --job-uid N`)
-- must lie in it.
CREATE FUNCTION trnflow.next_job_uid() RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record := trnflow.job_uid_range();
  v bigint;
BEGIN
  IF r.lo IS NULL THEN
    RETURN nextval('trnflow.project_job_uids');
  END IF;
  SELECT min(u) INTO v
  FROM (SELECT greatest(r.lo, coalesce(max(job_uid) + 1, r.lo)) AS u FROM trnflow.projects
        WHERE job_uid BETWEEN r.lo AND r.hi) x
  WHERE u <= r.hi;
  IF v IS NULL THEN  -- the top is taken: the lowest gap
    SELECT min(g) INTO v FROM generate_series(r.lo, r.hi) g
    WHERE NOT EXISTS (SELECT 1 FROM trnflow.projects WHERE job_uid = g);
  END IF;
  IF v IS NULL THEN
    RAISE EXCEPTION 'every job uid of this catalog''s range %-% is taken', r.lo, r.hi
      USING ERRCODE = 'TF001', HINT = 'widen it: trnflow db migrate --job-uid-range START-END';
  END IF;
  RETURN v;
END $$;
ALTER TABLE trnflow.projects ALTER COLUMN job_uid SET DEFAULT trnflow.next_job_uid();

CREATE FUNCTION trnflow.check_job_uid() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE r record := trnflow.job_uid_range();
BEGIN
  IF r.lo IS NOT NULL AND NEW.job_uid NOT BETWEEN r.lo AND r.hi THEN
    RAISE EXCEPTION 'job uid % is outside this catalog''s range %-%', NEW.job_uid, r.lo, r.hi
      USING ERRCODE = '22023',
      HINT = 'pick one in the range, or change the range: trnflow db migrate --job-uid-range START-END';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER projects_job_uid_in_range BEFORE INSERT ON trnflow.projects
  FOR EACH ROW EXECUTE FUNCTION trnflow.check_job_uid();
CREATE TRIGGER projects_job_uid_change_in_range BEFORE UPDATE OF job_uid ON trnflow.projects
  FOR EACH ROW WHEN (NEW.job_uid IS DISTINCT FROM OLD.job_uid)
  EXECUTE FUNCTION trnflow.check_job_uid();

REVOKE EXECUTE ON FUNCTION trnflow.set_job_uid_range(bigint, bigint, boolean),
  trnflow.claim_default_job_uid_range() FROM PUBLIC;

SELECT trnflow.claim_default_job_uid_range();
