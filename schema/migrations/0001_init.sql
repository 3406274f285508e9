-- The trnflow catalog: projects, hardware and prices, pipelines, runs, stages and their
-- dependencies, the attempt ledger, artifacts, events, workers. Applied by `trnflow db migrate`.

CREATE TABLE trnflow.projects (
  name        text PRIMARY KEY,
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE trnflow.instance_types (
  name                     text PRIMARY KEY,
  family                   text NOT NULL,
  pool                     text NOT NULL,
  accelerator              text NOT NULL,
  chips                    int NOT NULL,
  cores_per_chip           int NOT NULL,
  hbm_gib_per_chip         double precision NOT NULL,
  hbm_gbps_per_chip        double precision NOT NULL,
  bf16_tflops_per_chip     double precision NOT NULL,
  fp8_tflops_per_chip      double precision NOT NULL,
  vcpus                    int NOT NULL,
  memory_gib               double precision NOT NULL,
  network_gbps             double precision NOT NULL,
  spot_interruption_bucket text NOT NULL,
  sources                  jsonb NOT NULL DEFAULT '{}'
);

-- A price change adds a row; history is never rewritten. An attempt is charged the price
-- valid when it started.
CREATE TABLE trnflow.prices (
  instance_type       text NOT NULL REFERENCES trnflow.instance_types(name),
  valid_from          timestamptz NOT NULL,
  on_demand_usd_hour  numeric(12,6) NOT NULL,
  spot_usd_hour       numeric(12,6) NOT NULL,
  PRIMARY KEY (instance_type, valid_from)
);

-- Immutable: the same file text is stored once.
CREATE TABLE trnflow.pipelines (
  id          bigserial PRIMARY KEY,
  name        text NOT NULL,
  spec_hash   text NOT NULL,
  source      text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (name, spec_hash)
);

CREATE TABLE trnflow.runs (
  id                    bigserial PRIMARY KEY,
  pipeline_id           bigint NOT NULL REFERENCES trnflow.pipelines(id),
  project               text NOT NULL REFERENCES trnflow.projects(name),
  state                 text NOT NULL DEFAULT 'running'
                        CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
  params                jsonb NOT NULL DEFAULT '{}',
  speed                 double precision NOT NULL CHECK (speed > 0),
  seed                  bigint NOT NULL,
  spot_rate_multiplier  double precision NOT NULL DEFAULT 1,
  budget_usd            numeric(18,6),
  workdir               text NOT NULL,
  submitted_by          text NOT NULL DEFAULT current_user,
  created_at            timestamptz NOT NULL DEFAULT now(),
  finished_at           timestamptz
);
CREATE INDEX runs_project_created ON trnflow.runs (project, created_at DESC);
CREATE INDEX runs_active ON trnflow.runs (id) WHERE state = 'running';

CREATE TABLE trnflow.stages (
  id                bigserial PRIMARY KEY,
  run_id            bigint NOT NULL REFERENCES trnflow.runs(id) ON DELETE CASCADE,
  name              text NOT NULL,
  kind              text NOT NULL,
  pool              text NOT NULL,
  instance_type     text NOT NULL REFERENCES trnflow.instance_types(name),
  instance_count    int NOT NULL CHECK (instance_count > 0),
  market            text NOT NULL CHECK (market IN ('spot', 'on-demand')),
  state             text NOT NULL CHECK (state IN ('blocked', 'ready', 'running', 'retry_wait',
                        'succeeded', 'cached', 'failed', 'skipped', 'cancelled')),
  pending_needs     int NOT NULL DEFAULT 0,      -- needs not yet succeeded
  priority          int NOT NULL DEFAULT 0,
  attempts          int NOT NULL DEFAULT 0,      -- number of the latest attempt
  errors            int NOT NULL DEFAULT 0,      -- attempts that ended in an error outcome
  preemptions       int NOT NULL DEFAULT 0,      -- attempts the market took away
  progress          double precision NOT NULL DEFAULT 0,  -- 0..1, from the last checkpoint
  spec              jsonb NOT NULL,
  ready_at          timestamptz,                 -- ready: since; retry_wait: when due
  lease_owner       uuid,                        -- worker incarnation holding the lease
  lease_expires_at  timestamptz,
  created_at        timestamptz NOT NULL DEFAULT now(),
  finished_at       timestamptz,
  UNIQUE (run_id, name)
);
-- Claims scan only ready rows; leases and retries have their own narrow partial indexes.
CREATE INDEX stages_ready ON trnflow.stages (pool, priority DESC, ready_at, id) WHERE state = 'ready';
CREATE INDEX stages_leases ON trnflow.stages (lease_owner) WHERE state = 'running';
CREATE INDEX stages_lease_expiry ON trnflow.stages (lease_expires_at) WHERE state = 'running';
CREATE INDEX stages_retry_due ON trnflow.stages (ready_at) WHERE state = 'retry_wait';

CREATE TABLE trnflow.stage_deps (
  stage_id  bigint NOT NULL REFERENCES trnflow.stages(id) ON DELETE CASCADE,
  needs_id  bigint NOT NULL REFERENCES trnflow.stages(id) ON DELETE CASCADE,
  PRIMARY KEY (stage_id, needs_id)
);
CREATE INDEX stage_deps_needs ON trnflow.stage_deps (needs_id);

CREATE TABLE trnflow.workers (
  id            uuid PRIMARY KEY,                -- incarnation: new for every process start
  host          text NOT NULL,
  pid           int NOT NULL,
  pools         jsonb NOT NULL,
  started_at    timestamptz NOT NULL DEFAULT now(),
  heartbeat_at  timestamptz NOT NULL DEFAULT now(),
  stopped_at    timestamptz
);

-- The ledger: one row per attempt, opened by the claim and closed once.
CREATE TABLE trnflow.attempts (
  id              bigserial PRIMARY KEY,
  stage_id        bigint NOT NULL REFERENCES trnflow.stages(id) ON DELETE CASCADE,
  run_id          bigint NOT NULL REFERENCES trnflow.runs(id) ON DELETE CASCADE,
  attempt         int NOT NULL,
  worker_id       uuid NOT NULL,
  worker_name     text NOT NULL,
  instance_type   text NOT NULL,
  instance_count  int NOT NULL,
  market          text NOT NULL,
  price_usd_hour  numeric(12,6) NOT NULL,        -- price snapshot at the start
  started_at      timestamptz NOT NULL DEFAULT now(),
  finished_at     timestamptz,
  sim_seconds     double precision,
  billed_seconds  bigint,
  outcome         text CHECK (outcome IN ('succeeded', 'cached', 'failed', 'spot_interruption',
                      'capacity_unavailable', 'lost', 'timeout', 'infra_error', 'user_error',
                      'cancelled', 'budget_exceeded')),
  progress_from   double precision NOT NULL DEFAULT 0,
  progress_to     double precision,
  cost_usd        numeric(18,6),
  wasted_usd      numeric(18,6),
  saved_usd       numeric(18,6),
  message         text,
  UNIQUE (stage_id, attempt)
);
CREATE INDEX attempts_run ON trnflow.attempts (run_id);
CREATE INDEX attempts_started ON trnflow.attempts (started_at);

CREATE FUNCTION trnflow.attempts_closed_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.outcome IS NOT NULL THEN
    RAISE EXCEPTION 'attempt % of stage % is closed; the ledger is append-only',
      OLD.attempt, OLD.stage_id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER attempts_closed_once BEFORE UPDATE ON trnflow.attempts
  FOR EACH ROW EXECUTE FUNCTION trnflow.attempts_closed_once();

CREATE TABLE trnflow.artifacts (
  id                bigserial PRIMARY KEY,
  cache_key         text NOT NULL UNIQUE,
  digest            text,
  bytes             bigint,
  state             text NOT NULL CHECK (state IN ('building', 'ready', 'failed')),
  producer_attempt  bigint REFERENCES trnflow.attempts(id),
  manifest          jsonb NOT NULL DEFAULT '{}',
  hits              bigint NOT NULL DEFAULT 0,
  created_at        timestamptz NOT NULL DEFAULT now(),
  last_used_at      timestamptz
);

CREATE TABLE trnflow.events (
  id        bigserial PRIMARY KEY,
  run_id    bigint REFERENCES trnflow.runs(id) ON DELETE CASCADE,
  stage_id  bigint REFERENCES trnflow.stages(id) ON DELETE CASCADE,
  at        timestamptz NOT NULL DEFAULT now(),
  kind      text NOT NULL,
  message   text NOT NULL,
  data      jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX events_run ON trnflow.events (run_id, id);

-- Views for people and scripts (INTERFACES.md).
CREATE VIEW trnflow.attempt_ledger AS
SELECT a.run_id, r.project, p.name AS pipeline, s.name AS stage, s.kind, a.attempt,
       a.worker_name AS worker, a.instance_type, a.instance_count, a.market, a.started_at,
       a.finished_at, a.billed_seconds / 3600.0 AS sim_hours, a.outcome, a.cost_usd,
       a.wasted_usd, a.saved_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id;

CREATE VIEW trnflow.stage_status AS
SELECT s.run_id, r.project, p.name AS pipeline, s.name AS stage, s.kind, s.state,
       s.attempts, coalesce(c.cost_usd, 0) AS cost_usd
FROM trnflow.stages s
JOIN trnflow.runs r ON r.id = s.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
LEFT JOIN (SELECT stage_id, sum(cost_usd) AS cost_usd FROM trnflow.attempts GROUP BY stage_id) c
  ON c.stage_id = s.id;

CREATE VIEW trnflow.run_status AS
SELECT r.id AS run_id, r.project, p.name AS pipeline, r.state, r.created_at, r.finished_at,
       coalesce((SELECT sum(a.cost_usd) FROM trnflow.attempts a WHERE a.run_id = r.id), 0)
         AS cost_usd
FROM trnflow.runs r
JOIN trnflow.pipelines p ON p.id = r.pipeline_id;

CREATE VIEW trnflow.spend_daily AS
SELECT r.project, (a.started_at AT TIME ZONE 'UTC')::date AS day,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd,
       sum(coalesce(a.saved_usd, 0)) AS saved_usd
FROM trnflow.attempts a
JOIN trnflow.runs r ON r.id = a.run_id
GROUP BY 1, 2;

CREATE VIEW trnflow.spend_by_stage AS
SELECT r.project, p.name AS pipeline, s.name AS stage, s.kind,
       count(DISTINCT a.run_id) AS runs, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd,
       sum(coalesce(a.saved_usd, 0)) AS saved_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
GROUP BY 1, 2, 3, 4;
