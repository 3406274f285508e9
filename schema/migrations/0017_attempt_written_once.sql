-- The ledger row of an attempt is written once, when the attempt closes (bench/analysis.md).
--
-- Until now the claim inserted an open attempt row (five index entries) and the completion
-- updated it (a non-HOT update: four more index entries, a row trigger, the rollup's trigger
-- reading old and new rows): two ledger writes per stage where a job queue makes none. What an
-- open attempt knows at claim time (its id, worker, market, prices, start, queue wait, resume
-- point, spend cap, executor job) now travels in the stage row the claim updates anyway, and
-- the completion inserts the closed row whole, in the statement that moves the stage on.
--
-- trnflow.attempts holds closed attempts only, and nothing updates or deletes them: the
-- daemons may only insert, and a statement trigger refuses UPDATE and DELETE from anyone.
-- trnflow.open_attempts shows the attempts running now, in the ledger's columns; the
-- attempt_ledger view shows both, one row per attempt, as before.

ALTER TABLE trnflow.stages
  ADD COLUMN attempt_id bigint,                     -- the ledger id the attempt will close with
  ADD COLUMN attempt_worker_id uuid,
  ADD COLUMN attempt_worker_name text,
  ADD COLUMN attempt_market text,
  ADD COLUMN attempt_price_usd_hour numeric(12,6),
  ADD COLUMN attempt_on_demand_price_usd_hour numeric(12,6),
  ADD COLUMN attempt_started_at timestamptz,
  ADD COLUMN attempt_queued_at timestamptz,
  ADD COLUMN attempt_progress_from double precision,
  ADD COLUMN attempt_cap_usd numeric(18,6),
  ADD COLUMN attempt_reserved_usd numeric(18,6),
  ADD COLUMN attempt_executor_job text;

-- A cache entry names the attempt that built it while that attempt is still open.
ALTER TABLE trnflow.artifacts DROP CONSTRAINT IF EXISTS artifacts_producer_attempt_fkey;

-- Attempts open now move into their stage rows (a running stage has exactly one).
UPDATE trnflow.stages s
SET attempt_id = a.id, attempt_worker_id = a.worker_id, attempt_worker_name = a.worker_name,
    attempt_market = a.market,
    attempt_price_usd_hour = a.price_usd_hour,
    attempt_on_demand_price_usd_hour = a.on_demand_price_usd_hour,
    attempt_started_at = a.started_at, attempt_queued_at = a.queued_at,
    attempt_progress_from = a.progress_from, attempt_cap_usd = a.cap_usd,
    attempt_reserved_usd = a.reserved_usd, attempt_executor_job = a.executor_job
FROM trnflow.attempts a
WHERE a.stage_id = s.id AND a.attempt = s.attempts AND a.outcome IS NULL;
-- An open row whose stage is no longer running under it (none should exist) is closed as
-- lost rather than dropped: the ledger keeps every attempt it ever opened.
UPDATE trnflow.attempts a
SET outcome = 'lost', finished_at = coalesce(a.finished_at, now()), sim_seconds = 0,
    billed_seconds = 0, cost_usd = 0, wasted_usd = 0, saved_usd = 0, progress_to = a.progress_from,
    message = 'closed by migration 0017: its stage was not running it'
WHERE a.outcome IS NULL
  AND NOT EXISTS (SELECT 1 FROM trnflow.stages s
                  WHERE s.id = a.stage_id AND s.attempts = a.attempt AND s.state = 'running');
DELETE FROM trnflow.attempts WHERE outcome IS NULL;

-- Every row is closed from here on.
ALTER TABLE trnflow.attempts ADD CONSTRAINT attempts_closed
  CHECK (outcome IS NOT NULL AND finished_at IS NOT NULL);
DROP INDEX IF EXISTS trnflow.attempts_open;

-- Append-only by rights and by a statement trigger (no per-row cost on insert).
DROP TRIGGER attempts_closed_once ON trnflow.attempts;
CREATE OR REPLACE FUNCTION trnflow.attempts_closed_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the ledger is append-only: attempts are written once, when they close'
    USING ERRCODE = '42501';
END $$;
CREATE TRIGGER attempts_closed_once BEFORE UPDATE OR DELETE OR TRUNCATE ON trnflow.attempts
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.attempts_closed_once();
DO $$
BEGIN
  EXECUTE format('REVOKE UPDATE ON trnflow.attempts FROM %I', trnflow.daemon_role());
  EXECUTE format('REVOKE UPDATE (billed_seconds, reserved_usd, baseline_usd, executor_job,
                  saved_usd, cost_usd, wasted_usd, message, sim_seconds, finished_at, progress_to,
                  cap_usd, outcome) ON trnflow.attempts FROM %I', trnflow.daemon_role());
END $$;

-- The rollup folds each closed attempt as it is inserted.
DROP TRIGGER attempts_roll_up ON trnflow.attempts;
CREATE TRIGGER attempts_roll_up AFTER INSERT ON trnflow.attempts
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.roll_up_attempts();

-- The attempts running now, in the ledger's columns.
CREATE VIEW trnflow.open_attempts WITH (security_invoker = true) AS
SELECT s.attempt_id AS id, s.id AS stage_id, s.run_id, s.attempts AS attempt,
       s.attempt_worker_id AS worker_id, s.attempt_worker_name AS worker_name, s.instance_type,
       s.instance_count, s.attempt_market AS market, s.attempt_price_usd_hour AS price_usd_hour,
       s.attempt_on_demand_price_usd_hour AS on_demand_price_usd_hour,
       s.attempt_started_at AS started_at, s.attempt_queued_at AS queued_at,
       s.attempt_progress_from AS progress_from, s.attempt_cap_usd AS cap_usd,
       s.attempt_reserved_usd AS reserved_usd, s.attempt_executor_job AS executor_job
FROM trnflow.stages s
WHERE s.state = 'running';

-- One row per attempt, running ones included (outcome, finished_at and costs empty).
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
FROM trnflow.stages s
JOIN trnflow.runs r ON r.id = s.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE s.state = 'running';

-- Who may read them: project roles read whole stage rows already and get the view (now and
-- from ensure_project, which `project add` and `grant` call); the site's reader (spend, nothing
-- else) gets the open attempt's ledger columns, as it has them on attempts.
CREATE OR REPLACE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0008(p);
  EXECUTE format('GRANT SELECT ON trnflow.event_log, trnflow.open_attempts TO %I',
                 trnflow.project_role(p));
END $$;
DO $$
DECLARE p text;
BEGIN
  EXECUTE format('GRANT SELECT (attempt_id, attempt_worker_name, attempt_market,
                  attempt_price_usd_hour, attempt_on_demand_price_usd_hour, attempt_started_at,
                  instance_type, instance_count) ON trnflow.stages TO %I', trnflow.reader_role());
  EXECUTE format('GRANT SELECT ON trnflow.open_attempts TO %I', trnflow.daemon_role());
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- A spend cap is reserved on the stage row of the open attempt.
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
             - coalesce((SELECT sum(cost_usd) FROM trnflow.spend_rollup
                         WHERE project = a.project AND day >= b.start::date), 0)
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
