-- Money under faults (docs/spend.md#how-each-figure-is-computed):
--   1. Cancel wins. cancel_run marks the run's running stages (stages.stop_reason) before it
--      ends the others, and the close of an attempt (worker's, rescuer's, hand-back) never puts
--      a stage of a cancelled run back in the queue: a lost attempt of a cancelled run ends its
--      stage `cancelled`, and `resume` works at once.
--   2. "Spent so far" is what the ledger will bill: an open attempt counts up to its last
--      heartbeat (the simulated seconds it last reported, or the time from its start to that
--      heartbeat at the run's speed), never past its cap; the rescuer bills a lost attempt by
--      the same function. trnflow.running_cost_usd (to the wall clock) is gone.
--   3. Budget admission in SQL: every submission (run, submit, cron fires, a member's own SQL
--      call) meets trnflow.admit_run, with one refusal.
--   4. A run a foreground `trnflow run` executes is held by it (trnflow.held_runs): daemon
--      workers do not claim its stages.
--   5. Workers record their lease, so a worker is shown dead once it lapses.
--   6. Only this catalog's roles may connect to its database.

-- 1. Cancel wins ---------------------------------------------------------------------------
ALTER TABLE trnflow.stages ADD COLUMN stop_reason text;  -- set on a running stage by cancel_run

-- The order matters (each statement takes a new snapshot): the run is marked; its queue rows go
-- (claims holding one finish first); its running stages are marked (a completion in flight
-- finishes first, and one that has not begun sees the mark); only then are the stages that
-- are not running ended, which now include any that such a completion requeued; last, any
-- queue row a completion added meanwhile goes.
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
  -- The cancel's own instant (not its transaction's start): no attempt of the run starts later.
  UPDATE trnflow.runs SET state = 'cancelled', finished_at = clock_timestamp(),
                          cancel_reason = p_reason
  WHERE id = p_run AND state = 'running';
  GET DIAGNOSTICS cancelled = ROW_COUNT;
  stages_cancelled := 0;
  IF cancelled > 0 THEN
    DELETE FROM trnflow.ready_stages WHERE run_id = p_run;
    UPDATE trnflow.stages SET stop_reason = p_reason WHERE run_id = p_run AND state = 'running';
    UPDATE trnflow.stages SET state = 'cancelled', finished_at = now(), pending_needs = 0,
                              retry_at = NULL
    WHERE run_id = p_run AND state IN ('blocked', 'ready', 'retry_wait');
    GET DIAGNOSTICS stages_cancelled = ROW_COUNT;
    DELETE FROM trnflow.ready_stages WHERE run_id = p_run;
    PERFORM pg_notify('trnflow_cancel', p_run::text);
  END IF;
  SELECT count(*) INTO stages_running FROM trnflow.running_stages WHERE run_id = p_run;
END $$;

-- 2. Spent so far ---------------------------------------------------------------------------
-- What EC2 bills for `sim_seconds` of `instance_count` instances at `price_usd_hour`: whole
-- seconds rounded up, 60 at least, rounded half up to the micro-dollar. The SQL twin of
-- Charge() in common/money.h (tests/money_faults_test.cpp holds them to each other).
CREATE FUNCTION trnflow.charge_usd(price_usd_hour numeric, instance_count int, sim_seconds float8)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT round(price_usd_hour * instance_count
               * greatest(60, ceil(sim_seconds::numeric - 1e-9)) / 3600, 6)
$$;

-- The simulated seconds an open attempt is billed for if it ends now without a word (lost):
-- what it last reported at a heartbeat, or, if it never reported, the time from its start to
-- its last heartbeat at the run's speed; never past its spend cap. The live figure and the
-- rescuer's bill are both this.
CREATE FUNCTION trnflow.billable_sim_seconds(started_at timestamptz, heartbeat_at timestamptz,
                                             live_sim_seconds float8, speed float8,
                                             instance_count int, price_usd_hour numeric,
                                             cap_usd numeric)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT least(coalesce(live_sim_seconds,
                        greatest(extract(epoch FROM (coalesce(heartbeat_at, started_at)
                                                     - started_at)), 0) * speed),
               coalesce((cap_usd * 3600 / nullif(price_usd_hour * instance_count, 0))::float8,
                        'infinity'))
$$;

-- The attempts running now, with what they have cost so far: what each last reported at a
-- heartbeat, billed as the ledger will bill it. One that has reported nothing yet counts $0:
-- it may never start (a hand-back, a budget already spent, a cache hit), and the ledger bills
-- those nothing; if it dies unreported, the rescuer bills it to its last heartbeat. So the live
-- figure never runs ahead of the final bill, and trails it by at most one heartbeat.
CREATE OR REPLACE VIEW trnflow.open_attempts WITH (security_invoker = true) AS
SELECT s.attempt_id AS id, s.id AS stage_id, s.run_id, s.attempts AS attempt,
       s.attempt_worker_id AS worker_id, s.attempt_worker_name AS worker_name, s.instance_type,
       s.instance_count, s.attempt_market AS market, s.attempt_price_usd_hour AS price_usd_hour,
       s.attempt_on_demand_price_usd_hour AS on_demand_price_usd_hour,
       s.attempt_started_at AS started_at, s.attempt_queued_at AS queued_at,
       s.attempt_progress_from AS progress_from, s.attempt_cap_usd AS cap_usd,
       s.attempt_reserved_usd AS reserved_usd, s.attempt_executor_job AS executor_job,
       s.heartbeat_at, b.sim_seconds AS billable_sim_seconds,
       CASE WHEN s.live_sim_seconds IS NULL THEN 0  -- nothing reported: maybe never started
            ELSE trnflow.charge_usd(s.attempt_price_usd_hour, s.instance_count, b.sim_seconds)
       END AS cost_so_far_usd
FROM trnflow.running_stages q
JOIN trnflow.stages s ON s.id = q.stage_id
JOIN trnflow.runs r ON r.id = s.run_id
CROSS JOIN LATERAL (
  SELECT trnflow.billable_sim_seconds(s.attempt_started_at, s.heartbeat_at, s.live_sim_seconds,
                                      r.speed, s.instance_count, s.attempt_price_usd_hour,
                                      s.attempt_cap_usd) AS sim_seconds) b
WHERE s.state = 'running';

DROP FUNCTION trnflow.running_cost_usd(timestamptz, float8, int, numeric, numeric);

-- A run's spend: its ledger plus its open attempts so far. A project's in the current period
-- of its budget: the rollup plus its open attempts. Read with the caller's rights.
CREATE FUNCTION trnflow.run_spent_usd(p_run bigint) RETURNS numeric
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce((SELECT sum(a.cost_usd) FROM trnflow.attempts a WHERE a.run_id = p_run), 0)
       + coalesce((SELECT sum(o.cost_so_far_usd) FROM trnflow.open_attempts o
                   WHERE o.run_id = p_run), 0)
$$;

CREATE FUNCTION trnflow.budget_period_start(p_period text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN p_period = 'month'
              THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
              ELSE '-infinity'::timestamptz END
$$;

CREATE FUNCTION trnflow.project_spent_usd(p_project text, p_since timestamptz) RETURNS numeric
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce((SELECT sum(cost_usd) FROM trnflow.spend_rollup
                   WHERE project = p_project AND day >= p_since::date), 0)
       + coalesce((SELECT sum(o.cost_so_far_usd) FROM trnflow.open_attempts o
                   JOIN trnflow.runs r ON r.id = o.run_id WHERE r.project = p_project), 0)
$$;

-- Dollars as people read them: "$12.35", "-$0.50", never "-$0.00".
CREATE FUNCTION trnflow.dollars(usd numeric) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN round(usd, 2) < 0 THEN '-$' ELSE '$' END
         || to_char(abs(round(usd, 2)), 'FM999999999999990.00')
$$;

DO $$
DECLARE r text := trnflow.reader_role();
BEGIN
  EXECUTE format('GRANT SELECT (heartbeat_at, live_sim_seconds) ON trnflow.stages TO %I', r);
END $$;

-- 3. Budget admission ------------------------------------------------------------------------
-- Refuses (TF001, exit 4) a run whose planned cost exceeds its own budget_usd or what its
-- project's budget has left. `p_planned` is the caller's plan (`trnflow plan`'s figure); it is
-- never taken below what SQL itself can tell: every stage's billing minute at today's price.
-- A caller that passes less (or nothing) is held to that floor, and a run admitted on a low
-- figure is still capped at the budget by the reservation every attempt takes.
CREATE FUNCTION trnflow.admit_run(p_project text, p_budget numeric, p_planned numeric,
                                  p_unknown int, p_types text[], p_counts int[],
                                  p_markets text[])
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  floor_usd numeric;
  planned numeric;
  b record;
  left_usd numeric;
  est text;
  unknown text := '';
BEGIN
  SELECT coalesce(sum(trnflow.charge_usd(CASE WHEN t.market = 'spot' THEN p.spot_usd_hour
                                              ELSE p.on_demand_usd_hour END, t.cnt, 60)), 0)
  INTO floor_usd
  FROM unnest(p_types, p_counts, p_markets) AS t(itype, cnt, market)
  CROSS JOIN LATERAL (SELECT spot_usd_hour, on_demand_usd_hour FROM trnflow.prices
                      WHERE instance_type = t.itype AND valid_from <= now()
                      ORDER BY valid_from DESC LIMIT 1) p;
  planned := greatest(coalesce(p_planned, 0), floor_usd);
  IF p_unknown > 0 THEN
    unknown := format(' (at least: %s %s of unknown length counted at the billing minimum)',
                      p_unknown, CASE WHEN p_unknown = 1 THEN 'stage' ELSE 'stages' END);
  END IF;
  IF p_budget IS NOT NULL AND planned > p_budget THEN
    RAISE EXCEPTION '%', format('the plan estimates %s%s, over this run''s budget_usd %s (see `trnflow plan`); raise budget_usd, or pass --force',
      trnflow.dollars_apart(planned, p_budget), unknown, trnflow.dollars_apart(p_budget, planned))
      USING ERRCODE = 'TF001';
  END IF;
  FOR b IN SELECT amount_usd, period FROM trnflow.budgets WHERE project = p_project LOOP
    left_usd := b.amount_usd - trnflow.project_spent_usd(p_project,
                                                         trnflow.budget_period_start(b.period));
    IF planned > left_usd THEN
      RAISE EXCEPTION '%', format('the plan estimates %s%s but project %s has %s left of its %s budget of %s (%s spent); raise it with `trnflow budget set`, or pass --force',
        trnflow.dollars_apart(planned, left_usd), unknown, p_project,
        trnflow.dollars_apart(left_usd, planned), b.period, trnflow.dollars(b.amount_usd),
        trnflow.dollars(b.amount_usd - left_usd))
        USING ERRCODE = 'TF001';
    END IF;
  END LOOP;
END $$;

-- `a` in dollars, or to the micro-dollar when cents would show it equal to a different `b`.
CREATE FUNCTION trnflow.dollars_apart(a numeric, b numeric) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN a <> b AND trnflow.dollars(a) = trnflow.dollars(b)
              THEN CASE WHEN a < 0 THEN '-$' ELSE '$' END || to_char(abs(a), 'FM999999999999990.000000')
              ELSE trnflow.dollars(a) END
$$;

ALTER FUNCTION trnflow.submit_run(text, text, text, text, jsonb, float8, bigint, float8, numeric,
  text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[], int[], int[])
  RENAME TO submit_run_0023;

-- Submitting: 0023's checks and quota, after the budget admits the run (unless forced).
CREATE FUNCTION trnflow.submit_run(
  p_project text, p_pipeline text, p_spec_hash text, p_source text, p_params jsonb,
  p_speed float8, p_seed bigint, p_spot_rate float8, p_budget numeric, p_workdir text,
  p_retry_failed boolean, p_names text[], p_kinds text[], p_pools text[], p_types text[],
  p_counts int[], p_markets text[], p_pending int[], p_specs jsonb[], p_dep_from int[],
  p_dep_to int[], p_planned_usd numeric, p_unknown_stages int, p_force boolean) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.require_write(p_project, 'submitting a run');
  IF p_planned_usd IS NOT NULL AND NOT (p_planned_usd BETWEEN 0 AND 1e12) THEN
    RAISE EXCEPTION 'planned cost % is not in [0, 1e12]', p_planned_usd USING ERRCODE = '22023';
  END IF;
  IF p_unknown_stages IS NOT NULL AND NOT (p_unknown_stages BETWEEN 0 AND 1e7) THEN
    RAISE EXCEPTION 'invalid count of unknown stages' USING ERRCODE = '22023';
  END IF;
  IF p_types IS NOT NULL AND (coalesce(array_length(p_counts, 1), 0) <> array_length(p_types, 1)
                              OR coalesce(array_length(p_markets, 1), 0) <> array_length(p_types, 1)) THEN
    RAISE EXCEPTION 'the stage arrays have different lengths' USING ERRCODE = '22023';
  END IF;
  IF NOT coalesce(p_force, false) THEN
    -- Under the project's row lock, so two submits cannot both take the last dollars.
    PERFORM 1 FROM trnflow.projects WHERE name = p_project FOR NO KEY UPDATE;
    PERFORM trnflow.admit_run(p_project, p_budget, p_planned_usd, coalesce(p_unknown_stages, 0),
                              p_types, p_counts, p_markets);
  END IF;
  RETURN trnflow.submit_run_0023(p_project, p_pipeline, p_spec_hash, p_source, p_params, p_speed,
    p_seed, p_spot_rate, p_budget, p_workdir, p_retry_failed, p_names, p_kinds, p_pools, p_types,
    p_counts, p_markets, p_pending, p_specs, p_dep_from, p_dep_to);
END $$;

-- The earlier call, without a plan: admitted on SQL's own floor.
CREATE FUNCTION trnflow.submit_run(
  p_project text, p_pipeline text, p_spec_hash text, p_source text, p_params jsonb,
  p_speed float8, p_seed bigint, p_spot_rate float8, p_budget numeric, p_workdir text,
  p_retry_failed boolean, p_names text[], p_kinds text[], p_pools text[], p_types text[],
  p_counts int[], p_markets text[], p_pending int[], p_specs jsonb[], p_dep_from int[],
  p_dep_to int[]) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT trnflow.submit_run(p_project, p_pipeline, p_spec_hash, p_source, p_params, p_speed,
    p_seed, p_spot_rate, p_budget, p_workdir, p_retry_failed, p_names, p_kinds, p_pools, p_types,
    p_counts, p_markets, p_pending, p_specs, p_dep_from, p_dep_to, NULL::numeric, 0, false)
$$;

-- 4. Held runs -------------------------------------------------------------------------------
-- A run that a foreground `trnflow run` (or `watch --execute`) executes: daemon workers, which
-- claim for any run, skip its stages. worker_id: the holder's incarnation, set when it
-- registers. Released by `resume`/`retry` (the run goes to whoever serves its pools).
CREATE TABLE trnflow.held_runs (
  run_id    bigint PRIMARY KEY REFERENCES trnflow.runs(id) ON DELETE CASCADE,
  worker_id uuid,
  since     timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE trnflow.held_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trnflow.held_runs FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.id = run_id));

-- The claim's walk of the queue: as 0022, and a claim for any run ($3 = 0) passes over the
-- stages of held runs.
CREATE OR REPLACE FUNCTION trnflow.lock_ready_stages(p_pool text, p_capacity int, p_run bigint, p_max int)
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
      AND (p_run <> 0 OR NOT EXISTS (SELECT 1 FROM trnflow.held_runs h WHERE h.run_id = q.run_id))
    ORDER BY q.priority DESC, q.ready_at, q.stage_id
    LIMIT least(p_capacity, coalesce(nullif(p_max, 0), p_capacity))
    FOR UPDATE OF q SKIP LOCKED) c
  WHERE p.project IS NOT NULL;
END $$;

ALTER FUNCTION trnflow.reset_stages(bigint, text) RENAME TO reset_stages_0023;
CREATE FUNCTION trnflow.reset_stages(p_run bigint, p_stage text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE n int;
BEGIN
  n := trnflow.reset_stages_0023(p_run, p_stage);
  DELETE FROM trnflow.held_runs WHERE run_id = p_run;
  RETURN n;
END $$;

-- 5. Workers' leases --------------------------------------------------------------------------
ALTER TABLE trnflow.workers ADD COLUMN lease_s float8;

-- Grants ------------------------------------------------------------------------------------
REVOKE EXECUTE ON FUNCTION trnflow.submit_run_0023(text, text, text, text, jsonb, float8, bigint,
  float8, numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[],
  int[], int[]), trnflow.reset_stages_0023(bigint, text),
  trnflow.admit_run(text, numeric, numeric, int, text[], int[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb, float8, bigint,
  float8, numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[],
  int[], int[]), trnflow.submit_run(text, text, text, text, jsonb, float8, bigint,
  float8, numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[],
  int[], int[], numeric, int, boolean), trnflow.reset_stages(bigint, text) FROM PUBLIC;

CREATE FUNCTION trnflow.grant_member_functions(g text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('REVOKE EXECUTE ON FUNCTION trnflow.submit_run_0023(text, text, text, text,
                  jsonb, float8, bigint, float8, numeric, text, boolean, text[], text[], text[],
                  text[], int[], text[], int[], jsonb[], int[], int[]),
                  trnflow.reset_stages_0023(bigint, text) FROM %I', g);
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.submit_run(text, text, text, text, jsonb,
                  float8, bigint, float8, numeric, text, boolean, text[], text[], text[], text[],
                  int[], text[], int[], jsonb[], int[], int[]),
                  trnflow.submit_run(text, text, text, text, jsonb, float8, bigint, float8,
                  numeric, text, boolean, text[], text[], text[], text[], int[], text[], int[],
                  jsonb[], int[], int[], numeric, int, boolean),
                  trnflow.reset_stages(bigint, text) TO %I', g);
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.grant_member_functions(text) FROM PUBLIC;

ALTER FUNCTION trnflow.ensure_project(text) RENAME TO ensure_project_0022;
CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0022(p);
  PERFORM trnflow.grant_member_functions(trnflow.project_writer_role(p));
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(),  -- (6.)
                 trnflow.project_role(p));
  -- Members see whether the process running their run is gone (row-level security: their runs).
  EXECUTE format('GRANT SELECT ON trnflow.held_runs TO %I', trnflow.project_role(p));
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.ensure_project(text) FROM PUBLIC;

DO $$
DECLARE
  g text;
  d text := trnflow.daemon_role();
BEGIN
  FOR g IN SELECT d UNION SELECT trnflow.project_writer_role(name) FROM trnflow.projects LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = g) THEN CONTINUE; END IF;
    PERFORM trnflow.grant_member_functions(g);
  END LOOP;
  EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON trnflow.held_runs TO %I', d);
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.held_runs TO %I USING (true) WITH CHECK (true)', d);
  EXECUTE format('GRANT DELETE ON trnflow.workers TO %I', d);
END $$;

-- The state a closing attempt leaves its stage in: what the worker (or rescuer) decided, except
-- that a stage of a cancelled run (its row marked by cancel_run, or the run seen cancelled)
-- never goes back to the queue: it ends `cancelled`. CompleteAttempts applies it.
CREATE FUNCTION trnflow.closing_state(decided text, stop_reason text, run_state text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN decided IN ('ready', 'retry_wait')
                   AND (stop_reason IS NOT NULL OR run_state = 'cancelled')
              THEN 'cancelled' ELSE decided END
$$;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.closing_state(text, text, text) TO %I',
                 trnflow.daemon_role());
END $$;

-- 6. One catalog's logins reach no other catalog's database. Roles are the server's, so a
-- member granted in two catalogs is a role both catalogs' daemons may SET ROLE to (the
-- dashboard acts as its viewer); with CONNECT open to PUBLIC, one catalog's daemon login could
-- connect to the other catalog's database and read it as that member. CONNECT now goes only
-- to this catalog's own roles (its daemons, its reader, each project's read role, which its
-- members inherit); the daemon role is NOINHERIT (0023), so it never connects through a
-- member's grants.
DO $$
DECLARE p text;
BEGIN
  EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I, %I', current_database(),
                 trnflow.daemon_role(), trnflow.reader_role());
  FOR p IN SELECT trnflow.project_role(name) FROM trnflow.projects LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p) THEN CONTINUE; END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), p);
    EXECUTE format('GRANT SELECT ON trnflow.held_runs TO %I', p);
  END LOOP;
END $$;
