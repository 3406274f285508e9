-- 0031: the ledger in monthly partitions, so an old month can be archived and dropped whole
-- (issue 36, "Retention that a lab can run"; docs/operations.md, "Retention").
--
-- trnflow.attempts becomes PARTITION BY RANGE (started_at): one partition per UTC month,
-- trnflow.attempts_YYYY_MM, and trnflow.attempts_default for rows of a month that has none (only
-- rows dated before the first month, or far ahead: the scheduler makes the current month and
-- the next three every hour through attempts_partitions_ahead).
--
-- What stays as it was:
--   * exactly one ledger row per attempt. A partitioned table's unique keys must hold the
--     partition key, so they are (id, started_at) and (stage_id, attempt, started_at). The close
--     (CompleteAttempts) writes the row with the attempt's id and started_at as the claim put
--     them on the stage row, so a second close of the same attempt names the same partition and
--     hits the same keys (besides being fenced on the stage row: state, attempt, lease owner);
--     tests/partitions_test.cpp closes an attempt twice through the partitioned table;
--   * the statement triggers (rollups, /metrics counters) on the partitioned table: PostgreSQL
--     fires them once per statement with every partition's new rows in the transition table;
--     the append-only trigger on it, and on every partition too (a statement on a partition
--     itself does not fire the partitioned table's statement triggers);
--   * row-level security, its policies and every grant (copied from the old table: the
--     partitions have no grants of their own, so nobody but the owner reads one directly);
--   * the indexes (on run_id, on started_at, and the two keys);
--   * the views and on_demand_usd(trnflow.attempts), re-pointed at the new table with their
--     definitions, options and grants unchanged.
-- Existing rows are copied into their months' partitions before the triggers exist (the rollups
-- and counters already hold them), and the keys are built after the copy.
LOCK TABLE trnflow.attempts IN ACCESS EXCLUSIVE MODE;

-- The views over the ledger (directly, or through on_demand_usd of its row), as they read with
-- every name qualified, to be re-created over the new table.
SELECT set_config('trnflow.partitions36_path', current_setting('search_path'), true);
SET LOCAL search_path = pg_catalog;
CREATE TEMP TABLE partitions36_views ON COMMIT DROP AS
SELECT c.oid AS oid, c.oid::regclass::text AS name, c.reloptions, pg_get_viewdef(c.oid) AS def
FROM pg_class c
WHERE c.relkind = 'v' AND c.oid IN (
  SELECT r.ev_class FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
  WHERE d.classid = 'pg_rewrite'::regclass
    AND (d.refobjid = 'trnflow.attempts'::regclass
         OR d.refobjid = 'trnflow.on_demand_usd(trnflow.attempts)'::regprocedure));
-- The policies likewise (their expressions name the table).
CREATE TEMP TABLE partitions36_policies ON COMMIT DROP AS
SELECT p.polname, p.polcmd, p.polpermissive,
       (SELECT string_agg(CASE WHEN x = 0 THEN 'PUBLIC' ELSE x::regrole::text END, ', ')
        FROM unnest(p.polroles) x) AS roles,
       pg_get_expr(p.polqual, p.polrelid) AS qual,
       pg_get_expr(p.polwithcheck, p.polrelid) AS chk
FROM pg_policy p WHERE p.polrelid = 'trnflow.attempts'::regclass;
SELECT set_config('search_path', current_setting('trnflow.partitions36_path'), true);

ALTER TABLE trnflow.attempts RENAME TO attempts_unpartitioned;
ALTER INDEX trnflow.attempts_pkey RENAME TO attempts_unpartitioned_pkey;
ALTER INDEX trnflow.attempts_stage_id_attempt_key RENAME TO attempts_unpartitioned_stage_attempt;
ALTER INDEX trnflow.attempts_run RENAME TO attempts_unpartitioned_run;
ALTER INDEX trnflow.attempts_started RENAME TO attempts_unpartitioned_started;
ALTER FUNCTION trnflow.on_demand_usd(trnflow.attempts_unpartitioned)
  RENAME TO on_demand_usd_unpartitioned;
ALTER SEQUENCE trnflow.attempts_id_seq OWNED BY NONE;

CREATE TABLE trnflow.attempts (
  id                       bigint NOT NULL DEFAULT nextval('trnflow.attempts_id_seq'),
  stage_id                 bigint NOT NULL,
  run_id                   bigint NOT NULL,
  attempt                  integer NOT NULL,
  worker_id                uuid NOT NULL,
  worker_name              text NOT NULL,
  instance_type            text NOT NULL,
  instance_count           integer NOT NULL,
  market                   text NOT NULL,
  price_usd_hour           numeric(12,6) NOT NULL,
  started_at               timestamptz NOT NULL DEFAULT now(),
  finished_at              timestamptz,
  sim_seconds              double precision,
  billed_seconds           bigint,
  outcome                  text,
  progress_from            double precision NOT NULL DEFAULT 0,
  progress_to              double precision,
  cost_usd                 numeric(18,6),
  wasted_usd               numeric(18,6),
  saved_usd                numeric(18,6),
  message                  text,
  on_demand_price_usd_hour numeric(12,6),
  baseline_usd             numeric(18,6),
  cap_usd                  numeric(18,6),
  reserved_usd             numeric(18,6),
  executor_job             text,
  queued_at                timestamptz,
  CONSTRAINT attempts_closed CHECK (outcome IS NOT NULL AND finished_at IS NOT NULL),
  CONSTRAINT attempts_cost_bounded CHECK (cost_usd >= 0 AND cost_usd < 1000000000),
  CONSTRAINT attempts_outcome_check CHECK (outcome = ANY (ARRAY['succeeded', 'cached', 'failed',
    'spot_interruption', 'capacity_unavailable', 'lost', 'timeout', 'infra_error', 'user_error',
    'cancelled', 'budget_exceeded'])),
  CONSTRAINT attempts_price_bounded CHECK (price_usd_hour >= 0 AND price_usd_hour < 1000000),
  CONSTRAINT attempts_reserved_bounded CHECK (reserved_usd >= 0 AND reserved_usd < 1000000000000
    AND cap_usd >= 0 AND cap_usd < 1000000000000),
  CONSTRAINT attempts_time_bounded CHECK (sim_seconds >= 0
    AND sim_seconds < 1000000000000::numeric::double precision AND billed_seconds >= 0
    AND billed_seconds::numeric < 1000000000000),
  CONSTRAINT attempts_wasted_bounded CHECK (wasted_usd >= 0 AND wasted_usd < 1000000000)
) PARTITION BY RANGE (started_at);
ALTER SEQUENCE trnflow.attempts_id_seq OWNED BY trnflow.attempts.id;
CREATE TABLE trnflow.attempts_default PARTITION OF trnflow.attempts DEFAULT;

CREATE FUNCTION trnflow.on_demand_usd(a trnflow.attempts) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
  SELECT round(coalesce(a.on_demand_price_usd_hour, a.price_usd_hour) * a.instance_count
               * coalesce(a.billed_seconds, 0) / 3600, 6)
$$;

-- A statement on a partition itself fires its own statement triggers only.
CREATE TRIGGER attempts_closed_once BEFORE UPDATE OR DELETE OR TRUNCATE ON trnflow.attempts_default
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.attempts_closed_once();

-- The partition of the UTC month starting at p_month (its first day), made if missing; true
-- when made. A month whose rows already sit in the default partition is refused, naming them:
-- they are moved by hand (docs/operations.md, "Retention").
CREATE FUNCTION trnflow.attempts_make_partition(p_month date) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_name text;
  v_from timestamptz;
  v_to timestamptz;
BEGIN
  IF p_month IS NULL OR p_month <> date_trunc('month', p_month)::date
     OR p_month < DATE '2000-01-01' OR p_month > DATE '2999-12-01' THEN
    RAISE EXCEPTION 'attempts_make_partition: % is not the first day of a month from 2000 to 2999',
      p_month USING ERRCODE = '22023';
  END IF;
  v_name := 'attempts_' || to_char(p_month, 'YYYY_MM');
  IF to_regclass('trnflow.' || v_name) IS NOT NULL THEN
    RETURN false;
  END IF;
  v_from := p_month::timestamp AT TIME ZONE 'UTC';
  v_to := (p_month + interval '1 month')::timestamp AT TIME ZONE 'UTC';
  IF EXISTS (SELECT 1 FROM trnflow.attempts_default
             WHERE started_at >= v_from AND started_at < v_to) THEN
    RAISE EXCEPTION 'the ledger''s default partition holds attempts of %; the partition trnflow.% cannot be made over them',
      to_char(p_month, 'YYYY-MM'), v_name
      USING ERRCODE = '55000',
            HINT = 'move them as docs/operations.md ("Retention") says, then run it again';
  END IF;
  EXECUTE format('CREATE TABLE trnflow.%I PARTITION OF trnflow.attempts FOR VALUES FROM (%L) TO (%L)',
                 v_name, v_from, v_to);
  EXECUTE format('CREATE TRIGGER attempts_closed_once BEFORE UPDATE OR DELETE OR TRUNCATE ON trnflow.%I '
                 'FOR EACH STATEMENT EXECUTE FUNCTION trnflow.attempts_closed_once()', v_name);
  RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.attempts_make_partition(date) FROM PUBLIC;

-- The partitions of the current UTC month and of the p_ahead months after it, those missing
-- made; returns how many were made. The scheduler's `partitions` service calls it hourly.
-- Making a partition locks the ledger briefly; behind a long reader it gives up after 2 s rather
-- than hold every close queued behind it (the next hour tries again, months ahead of need).
CREATE FUNCTION trnflow.attempts_partitions_ahead(p_ahead int) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '2s'
AS $$
DECLARE
  v_this date := date_trunc('month', now() AT TIME ZONE 'UTC')::date;
  v_made int := 0;
BEGIN
  IF p_ahead IS NULL OR p_ahead < 0 OR p_ahead > 24 THEN
    RAISE EXCEPTION 'attempts_partitions_ahead: p_ahead is %, expected 0 to 24 months',
      coalesce(p_ahead::text, 'NULL') USING ERRCODE = '22023';
  END IF;
  FOR i IN 0..p_ahead LOOP
    IF trnflow.attempts_make_partition((v_this + make_interval(months => i))::date) THEN
      v_made := v_made + 1;
    END IF;
  END LOOP;
  RETURN v_made;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.attempts_partitions_ahead(int) FROM PUBLIC;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.attempts_partitions_ahead(int) TO %I',
                 trnflow.daemon_role());
END $$;

-- Every month the old table has rows of, and the current month and three ahead.
DO $$
DECLARE
  v_this date := date_trunc('month', now() AT TIME ZONE 'UTC')::date;
  v_first date;
  v_last date;
  m date;
BEGIN
  SELECT date_trunc('month', min(started_at) AT TIME ZONE 'UTC')::date,
         date_trunc('month', max(started_at) AT TIME ZONE 'UTC')::date
  INTO v_first, v_last FROM trnflow.attempts_unpartitioned;
  m := least(coalesce(v_first, v_this), v_this);
  v_last := greatest(coalesce(v_last, v_this), (v_this + interval '3 months')::date);
  WHILE m <= v_last LOOP
    PERFORM trnflow.attempts_make_partition(m);
    m := (m + interval '1 month')::date;
  END LOOP;
END $$;

INSERT INTO trnflow.attempts (id, stage_id, run_id, attempt, worker_id, worker_name, instance_type,
  instance_count, market, price_usd_hour, started_at, finished_at, sim_seconds, billed_seconds,
  outcome, progress_from, progress_to, cost_usd, wasted_usd, saved_usd, message,
  on_demand_price_usd_hour, baseline_usd, cap_usd, reserved_usd, executor_job, queued_at)
SELECT id, stage_id, run_id, attempt, worker_id, worker_name, instance_type,
  instance_count, market, price_usd_hour, started_at, finished_at, sim_seconds, billed_seconds,
  outcome, progress_from, progress_to, cost_usd, wasted_usd, saved_usd, message,
  on_demand_price_usd_hour, baseline_usd, cap_usd, reserved_usd, executor_job, queued_at
FROM trnflow.attempts_unpartitioned;

ALTER TABLE trnflow.attempts ADD CONSTRAINT attempts_pkey PRIMARY KEY (id, started_at);
ALTER TABLE trnflow.attempts
  ADD CONSTRAINT attempts_stage_id_attempt_key UNIQUE (stage_id, attempt, started_at);
CREATE INDEX attempts_run ON trnflow.attempts (run_id);
CREATE INDEX attempts_started ON trnflow.attempts (started_at);

CREATE TRIGGER attempts_closed_once BEFORE UPDATE OR DELETE OR TRUNCATE ON trnflow.attempts
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.attempts_closed_once();
CREATE TRIGGER attempts_count_metrics AFTER INSERT ON trnflow.attempts
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
  EXECUTE FUNCTION trnflow.count_closed_attempts();
CREATE TRIGGER attempts_roll_up AFTER INSERT ON trnflow.attempts
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
  EXECUTE FUNCTION trnflow.roll_up_attempts();

-- Security as it was: row-level security, the policies, the table's and columns' grants, and
-- the grants on on_demand_usd.
ALTER TABLE trnflow.attempts ENABLE ROW LEVEL SECURITY;
DO $$
DECLARE
  r record;
BEGIN
  IF (SELECT relforcerowsecurity FROM pg_class
      WHERE oid = 'trnflow.attempts_unpartitioned'::regclass) THEN
    ALTER TABLE trnflow.attempts FORCE ROW LEVEL SECURITY;
  END IF;
  FOR r IN SELECT * FROM partitions36_policies LOOP
    EXECUTE format('CREATE POLICY %I ON trnflow.attempts AS %s FOR %s TO %s%s%s', r.polname,
                   CASE WHEN r.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                   CASE r.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT'
                                 WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                   r.roles,
                   CASE WHEN r.qual IS NULL THEN '' ELSE ' USING (' || r.qual || ')' END,
                   CASE WHEN r.chk IS NULL THEN '' ELSE ' WITH CHECK (' || r.chk || ')' END);
  END LOOP;
  FOR r IN SELECT a.privilege_type AS priv, a.grantee, a.is_grantable, NULL::name AS col
           FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
           WHERE c.oid = 'trnflow.attempts_unpartitioned'::regclass AND a.grantee <> c.relowner
           UNION ALL
           SELECT a.privilege_type, a.grantee, a.is_grantable, at.attname
           FROM pg_attribute at CROSS JOIN LATERAL aclexplode(at.attacl) a
           WHERE at.attrelid = 'trnflow.attempts_unpartitioned'::regclass AND at.attnum > 0
             AND NOT at.attisdropped LOOP
    EXECUTE format('GRANT %s%s ON trnflow.attempts TO %s%s', r.priv,
                   CASE WHEN r.col IS NULL THEN '' ELSE format(' (%I)', r.col) END,
                   CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END,
                   CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
  END LOOP;
  FOR r IN SELECT a.privilege_type AS priv, a.grantee
           FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
           WHERE p.oid = 'trnflow.on_demand_usd_unpartitioned(trnflow.attempts_unpartitioned)'::regprocedure
             AND a.grantee <> p.proowner LOOP
    EXECUTE format('GRANT %s ON FUNCTION trnflow.on_demand_usd(trnflow.attempts) TO %s', r.priv,
                   CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
                 WHERE p.oid = 'trnflow.on_demand_usd_unpartitioned(trnflow.attempts_unpartitioned)'::regprocedure
                   AND a.grantee = 0)
     AND (SELECT proacl FROM pg_proc
          WHERE oid = 'trnflow.on_demand_usd_unpartitioned(trnflow.attempts_unpartitioned)'::regprocedure) IS NOT NULL THEN
    REVOKE EXECUTE ON FUNCTION trnflow.on_demand_usd(trnflow.attempts) FROM PUBLIC;
  END IF;

  -- The views, as they were, over the new table.
  FOR r IN SELECT * FROM partitions36_views ORDER BY oid LOOP
    EXECUTE format('CREATE OR REPLACE VIEW %s%s AS %s', r.name,
                   CASE WHEN r.reloptions IS NULL THEN ''
                        ELSE ' WITH (' || array_to_string(r.reloptions, ', ') || ')' END,
                   rtrim(r.def, ';'));
  END LOOP;
END $$;

DROP FUNCTION trnflow.on_demand_usd_unpartitioned(trnflow.attempts_unpartitioned);
DROP TABLE trnflow.attempts_unpartitioned;
