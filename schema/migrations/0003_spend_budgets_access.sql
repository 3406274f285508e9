-- Spend reports, budgets and per-project access.

-- The ledger keeps both prices in force at the start (the market's and on-demand's), so spot
-- savings never depend on today's prices, and what the same work would have cost on the GPU
-- baseline (p4d.24xlarge), for "what did Neuron save us".
ALTER TABLE trnflow.attempts ADD COLUMN on_demand_price_usd_hour numeric(12,6);
ALTER TABLE trnflow.attempts ADD COLUMN baseline_usd numeric(18,6);
-- Existing rows get the price that was in force; a schema change, not a correction, so the
-- closed-once guard steps aside for it.
ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_closed_once;
UPDATE trnflow.attempts a
SET on_demand_price_usd_hour = (SELECT on_demand_usd_hour FROM trnflow.prices
                                WHERE instance_type = a.instance_type AND valid_from <= a.started_at
                                ORDER BY valid_from DESC LIMIT 1);
ALTER TABLE trnflow.attempts ENABLE TRIGGER attempts_closed_once;

ALTER TABLE trnflow.runs ADD COLUMN cancel_reason text;  -- 'cancelled' | 'budget_exceeded'

CREATE TABLE trnflow.budgets (
  project             text PRIMARY KEY REFERENCES trnflow.projects(name),
  amount_usd          numeric(18,6) NOT NULL CHECK (amount_usd > 0),
  period              text NOT NULL DEFAULT 'month' CHECK (period IN ('month', 'total')),
  notified_percent    int NOT NULL DEFAULT 0,       -- 0, 50, 80, 100 within notified_period
  notified_period     timestamptz,
  updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE trnflow.run_budget_notices (
  run_id   bigint PRIMARY KEY REFERENCES trnflow.runs(id) ON DELETE CASCADE,
  percent  int NOT NULL
);

-- Reports read a rollup kept by the ledger itself: one row per project, day, pipeline, stage,
-- kind, instance type and market. A statement trigger folds each batch of closed attempts in.
CREATE TABLE trnflow.spend_rollup (
  project        text NOT NULL,
  day            date NOT NULL,
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
  on_demand_usd  numeric NOT NULL,
  baseline_usd   numeric NOT NULL,
  PRIMARY KEY (project, day, pipeline, stage, kind, instance_type, market)
);

-- What an attempt's billed time would have cost on-demand.
CREATE FUNCTION trnflow.on_demand_usd(a trnflow.attempts) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
  SELECT round(coalesce(a.on_demand_price_usd_hour, a.price_usd_hour) * a.instance_count
               * coalesce(a.billed_seconds, 0) / 3600, 6)
$$;

CREATE FUNCTION trnflow.roll_up_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO trnflow.spend_rollup AS r
  SELECT ru.project, (n.started_at AT TIME ZONE 'UTC')::date, p.name, s.name, s.kind,
         n.instance_type, n.market, count(*), sum(coalesce(n.billed_seconds, 0)),
         sum(coalesce(n.cost_usd, 0)), sum(coalesce(n.wasted_usd, 0)),
         sum(coalesce(n.saved_usd, 0)), sum(trnflow.on_demand_usd(n)),
         sum(coalesce(n.baseline_usd, n.cost_usd, 0))
  FROM new_rows n
  JOIN old_rows o ON o.id = n.id AND o.outcome IS NULL AND n.outcome IS NOT NULL
  JOIN trnflow.stages s ON s.id = n.stage_id
  JOIN trnflow.runs ru ON ru.id = n.run_id
  JOIN trnflow.pipelines p ON p.id = ru.pipeline_id
  GROUP BY 1, 2, 3, 4, 5, 6, 7
  ORDER BY 1, 2, 3, 4, 5, 6, 7  -- concurrent committers lock rollup rows in one order
  ON CONFLICT (project, day, pipeline, stage, kind, instance_type, market) DO UPDATE
  SET attempts = r.attempts + EXCLUDED.attempts,
      billed_seconds = r.billed_seconds + EXCLUDED.billed_seconds,
      cost_usd = r.cost_usd + EXCLUDED.cost_usd,
      wasted_usd = r.wasted_usd + EXCLUDED.wasted_usd,
      saved_usd = r.saved_usd + EXCLUDED.saved_usd,
      on_demand_usd = r.on_demand_usd + EXCLUDED.on_demand_usd,
      baseline_usd = r.baseline_usd + EXCLUDED.baseline_usd;
  RETURN NULL;
END $$;
CREATE TRIGGER attempts_roll_up AFTER UPDATE ON trnflow.attempts
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.roll_up_attempts();

INSERT INTO trnflow.spend_rollup
SELECT ru.project, (n.started_at AT TIME ZONE 'UTC')::date, p.name, s.name, s.kind,
       n.instance_type, n.market, count(*), sum(coalesce(n.billed_seconds, 0)),
       sum(coalesce(n.cost_usd, 0)), sum(coalesce(n.wasted_usd, 0)),
       sum(coalesce(n.saved_usd, 0)), sum(trnflow.on_demand_usd(n)),
       sum(coalesce(n.baseline_usd, n.cost_usd, 0))
FROM trnflow.attempts n
JOIN trnflow.stages s ON s.id = n.stage_id
JOIN trnflow.runs ru ON ru.id = n.run_id
JOIN trnflow.pipelines p ON p.id = ru.pipeline_id
WHERE n.outcome IS NOT NULL
GROUP BY 1, 2, 3, 4, 5, 6, 7;

-- The views run with the caller's rights, so row-level security below applies to them.
ALTER VIEW trnflow.attempt_ledger SET (security_invoker = true);
ALTER VIEW trnflow.stage_status SET (security_invoker = true);
ALTER VIEW trnflow.run_status SET (security_invoker = true);
ALTER VIEW trnflow.spend_daily SET (security_invoker = true);
ALTER VIEW trnflow.spend_by_stage SET (security_invoker = true);

CREATE VIEW trnflow.spend_by_run WITH (security_invoker = true) AS
SELECT a.run_id, r.project, p.name AS pipeline, r.state, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd,
       sum(coalesce(a.saved_usd, 0)) AS saved_usd
FROM trnflow.attempts a
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
GROUP BY 1, 2, 3, 4;

CREATE VIEW trnflow.spend_by_instance WITH (security_invoker = true) AS
SELECT project, instance_type, market, sum(attempts) AS attempts,
       sum(billed_seconds) / 3600.0 AS billed_hours, sum(cost_usd) AS cost_usd,
       sum(wasted_usd) AS wasted_usd
FROM trnflow.spend_rollup
GROUP BY 1, 2, 3;

-- Spot against on-demand for the same billed time.
CREATE VIEW trnflow.spot_savings WITH (security_invoker = true) AS
SELECT project, pipeline, stage, sum(cost_usd) AS spot_cost_usd,
       sum(on_demand_usd) AS on_demand_usd, sum(on_demand_usd - cost_usd) AS savings_usd
FROM trnflow.spend_rollup
WHERE market = 'spot'
GROUP BY 1, 2, 3;

-- What interruptions cost: attempts the market (or a dead worker) ended, and the work lost.
CREATE VIEW trnflow.interruption_waste WITH (security_invoker = true) AS
SELECT r.project, p.name AS pipeline, s.name AS stage, a.outcome, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE a.outcome IN ('spot_interruption', 'capacity_unavailable', 'lost')
GROUP BY 1, 2, 3, 4;

CREATE VIEW trnflow.cache_savings WITH (security_invoker = true) AS
SELECT r.project, p.name AS pipeline, s.name AS stage, count(*) AS hits,
       sum(coalesce(a.saved_usd, 0)) AS saved_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE a.outcome = 'cached'
GROUP BY 1, 2, 3;

-- The same work on the GPU baseline (p4d.24xlarge, same market and instance count).
CREATE VIEW trnflow.gpu_baseline WITH (security_invoker = true) AS
SELECT project, pipeline, kind, sum(cost_usd) AS cost_usd, sum(baseline_usd) AS baseline_usd,
       sum(baseline_usd - cost_usd) AS neuron_savings_usd
FROM trnflow.spend_rollup
GROUP BY 1, 2, 3;

-- Access. A project's group role is trnflow_project_NAME (dashes become underscores);
-- trnflow_reader sees all spend and nothing else. The daemons run as the tables' owner.
CREATE FUNCTION trnflow.project_role(p text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'trnflow_project_' || replace(p, '-', '_')
$$;

CREATE FUNCTION trnflow.can_see_project(p text) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM pg_roles r
                 WHERE r.rolname IN (trnflow.project_role(p), 'trnflow_reader')
                   AND pg_has_role(current_user, r.oid, 'MEMBER'))
$$;

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trnflow_reader') THEN
    CREATE ROLE trnflow_reader NOLOGIN;  -- roles are per server, databases share it
  END IF;
EXCEPTION WHEN duplicate_object THEN NULL;  -- another database's migration made it first
END $$;

ALTER TABLE trnflow.projects ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.stages ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.stage_deps ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.events ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.pipelines ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.spend_rollup ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.budgets ENABLE ROW LEVEL SECURITY;
ALTER TABLE trnflow.run_budget_notices ENABLE ROW LEVEL SECURITY;

CREATE POLICY visible ON trnflow.projects FOR SELECT USING (trnflow.can_see_project(name));
CREATE POLICY visible ON trnflow.runs FOR SELECT USING (trnflow.can_see_project(project));
CREATE POLICY visible ON trnflow.spend_rollup FOR SELECT USING (trnflow.can_see_project(project));
CREATE POLICY visible ON trnflow.budgets FOR SELECT USING (trnflow.can_see_project(project));
-- Rows that hang off a run are visible when the run is (its own policy applies inside).
CREATE POLICY visible ON trnflow.stages FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.id = run_id));
CREATE POLICY visible ON trnflow.attempts FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.id = run_id));
CREATE POLICY visible ON trnflow.events FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.id = run_id));
CREATE POLICY visible ON trnflow.run_budget_notices FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.id = run_id));
CREATE POLICY visible ON trnflow.stage_deps FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.stages s WHERE s.id = stage_id));
CREATE POLICY visible ON trnflow.pipelines FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.pipeline_id = pipelines.id));

-- The reader: the columns spend is made of, through the views; no pipeline text, no specs.
GRANT USAGE ON SCHEMA trnflow TO trnflow_reader;
GRANT SELECT (name) ON trnflow.projects TO trnflow_reader;
GRANT SELECT (id, pipeline_id, project, state, created_at, finished_at) ON trnflow.runs
  TO trnflow_reader;
GRANT SELECT (id, name) ON trnflow.pipelines TO trnflow_reader;
GRANT SELECT (id, run_id, name, kind, state, attempts) ON trnflow.stages TO trnflow_reader;
GRANT SELECT (id, stage_id, run_id, attempt, worker_name, instance_type, instance_count, market,
              price_usd_hour, on_demand_price_usd_hour, started_at, finished_at, sim_seconds,
              billed_seconds, outcome, cost_usd, wasted_usd, saved_usd, baseline_usd)
  ON trnflow.attempts TO trnflow_reader;
GRANT SELECT ON trnflow.spend_rollup, trnflow.budgets TO trnflow_reader;
GRANT SELECT ON trnflow.attempt_ledger, trnflow.stage_status, trnflow.run_status,
                trnflow.spend_daily, trnflow.spend_by_stage, trnflow.spend_by_run,
                trnflow.spend_by_instance, trnflow.spot_savings, trnflow.interruption_waste,
                trnflow.cache_savings, trnflow.gpu_baseline
  TO trnflow_reader;
GRANT EXECUTE ON FUNCTION trnflow.can_see_project(text), trnflow.project_role(text),
                          trnflow.on_demand_usd(trnflow.attempts) TO PUBLIC;

-- The budget guard sums running attempts every tick: keep them in a narrow index.
CREATE INDEX attempts_open ON trnflow.attempts (run_id) WHERE outcome IS NULL;

-- `trnflow project add`: the project, its group role with read-only access, its members.
-- Names arrive as parameters and reach SQL only through format('%I').
CREATE FUNCTION trnflow.add_project(p text, members text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  role text := trnflow.project_role(p);
  m text;
BEGIN
  IF p !~ '^[a-z0-9][a-z0-9-]{0,62}$' THEN
    RAISE EXCEPTION 'invalid project name "%"', p USING ERRCODE = '22023',
      HINT = 'use lowercase letters, digits and -, starting with a letter or digit';
  END IF;
  INSERT INTO trnflow.projects (name) VALUES (p) ON CONFLICT (name) DO NOTHING;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role) THEN
    EXECUTE format('CREATE ROLE %I NOLOGIN', role);
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA trnflow TO %I', role);
  EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA trnflow TO %I', role);
  EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA trnflow GRANT SELECT ON TABLES TO %I', role);
  FOREACH m IN ARRAY members LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = m) THEN
      RAISE EXCEPTION 'there is no role "%" to add to project %', m, p USING ERRCODE = '42704',
        HINT = 'create the login role first: CREATE ROLE name LOGIN PASSWORD ...';
    END IF;
    EXECUTE format('GRANT %I TO %I', role, m);
  END LOOP;
  RETURN role;
END $$;
