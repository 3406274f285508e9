-- name: ClaimReadyStages
-- One statement claims as many ready stages of a pool as fit in the free capacity
-- ($2 instances), shared between projects by running share (migration 0032): for each project
-- with ready stages (found by skipping through the queue, trnflow.ready_stages; only the
-- projects in $8 when it is not NULL: a worker reserved for them), lock its first candidates
-- in priority order, at most as many as its caps leave room for, skipping rows other workers
-- hold (trnflow.lock_ready_stages: by the queue's index whatever the statistics say). Each
-- candidate's share is what its project would hold of the pool, over its weight, before it is
-- taken: the slots the project's stages run in now (every worker, every executor) plus those
-- of its candidates before it. The lowest share goes first, then priority, then age; the
-- prefix whose instance counts fit is taken. So the next free slot, one or a hundred, goes to
-- the project furthest below its weighted share, and a sweep of 20,000 stages cannot hold back
-- another project's single stage. Claimed stages leave the queue for running_stages (with
-- their pool and slots, which the next claim's shares read) and run
-- under this worker's lease with an attempt opened in the stage row at the price in force now
-- (its ledger row is written when it closes; queued_at: the stage's ready_at, which the claim
-- leaves as it was, so the attempt's queue wait is started_at - queued_at). No index of
-- `stages` holds a column this update writes, so the new row version can stay on its page
-- (migration 0022). $6: only this run (0: any). $7: at most this many stages (0: as many as
-- fit). `budgeted`: the run or its project has a budget, so the worker reserves a spend cap
-- for the attempt before it runs.
WITH locked AS (
  SELECT * FROM trnflow.lock_ready_stages($1, $2, $6::bigint, $7::int, $8::text[])
    AS l(queue_row, id, project, instance_count, priority, ready_at, running, weight)),
shares AS (
  SELECT queue_row, id, instance_count, priority, ready_at,
         (running + sum(instance_count) OVER (PARTITION BY project
                                              ORDER BY priority DESC, ready_at, id)
          - instance_count) / weight AS share
  FROM locked),
chosen AS (
  SELECT queue_row, id FROM (
    SELECT queue_row, id, sum(instance_count) OVER w AS used, row_number() OVER w AS n
    FROM shares WINDOW w AS (ORDER BY share, priority DESC, ready_at, id)) x
  WHERE used <= $2 AND ($7::int = 0 OR n <= $7)),
-- The stage rows, locked without waiting: one that a cancel or a resume holds (they lock the
-- stage first and its queue row second, the claim the other way round) is left to them, its
-- queue row kept. Foreign-key share locks do not conflict with this lock.
taken AS (
  SELECT x.id FROM trnflow.stages x
  WHERE x.id = ANY(ARRAY(SELECT id FROM chosen)) AND x.state = 'ready'
  FOR NO KEY UPDATE SKIP LOCKED),
-- Out of the queue by the rows locked above (no index needed to find them again): the stages
-- taken, and any row whose stage is no longer ready.
dequeued AS (
  DELETE FROM trnflow.ready_stages q
  WHERE q.ctid = ANY(ARRAY(SELECT queue_row FROM chosen))
    AND (q.stage_id IN (SELECT id FROM taken)
         OR NOT EXISTS (SELECT 1 FROM trnflow.stages s
                        WHERE s.id = q.stage_id AND s.state = 'ready'))),
claimed AS (
  -- The attempt opens in the stage row: its ledger row is written once, when it closes
  -- (CompleteAttempts). Price in force now, for the market the attempt runs on.
  UPDATE trnflow.stages s
  SET state = 'running', attempts = s.attempts + 1, lease_owner = $3::uuid,
      lease_expires_at = now() + make_interval(secs => $5), heartbeat_at = now(),
      live_progress = NULL, live_sim_seconds = NULL, live_eta_s = NULL,
      attempt_id = nextval('trnflow.attempts_id_seq'), attempt_worker_id = $3::uuid,
      attempt_worker_name = $4,
      attempt_market = s.market,
      -- Both prices from the one price row in force (none: both NULL).
      (attempt_price_usd_hour, attempt_on_demand_price_usd_hour) =
        (SELECT CASE WHEN s.market = 'spot' THEN spot_usd_hour ELSE on_demand_usd_hour END,
                on_demand_usd_hour
         FROM trnflow.prices
         WHERE instance_type = s.instance_type AND valid_from <= now()
         ORDER BY valid_from DESC LIMIT 1),
      attempt_started_at = now(), attempt_queued_at = s.ready_at,
      attempt_progress_from = s.progress, attempt_cap_usd = NULL, attempt_reserved_usd = NULL,
      attempt_executor_job = NULL
  -- By id through the primary key: a join to `chosen` was planned as a hash join over a
  -- sequential scan of every stage in the catalog, once per claim (~35 ms at 20,000 stages).
  WHERE s.id = ANY(ARRAY(SELECT id FROM taken))
  RETURNING s.id, s.run_id, s.attempts, s.instance_count, s.market, s.progress, s.errors,
            s.preemptions, s.spec, s.project, s.attempt_price_usd_hour, s.pool),
leased AS (
  INSERT INTO trnflow.running_stages (run_id, stage_id, project, pool, slots)
  SELECT run_id, id, project, pool, instance_count FROM claimed)
SELECT c.id, c.run_id, c.attempts, c.instance_count, c.market, c.progress, c.errors,
       c.preemptions, c.spec::text, (c.attempt_price_usd_hour * 1000000)::bigint, r.speed, r.seed,
       r.spot_rate_multiplier, r.workdir, r.retry_failed_compilation, c.project,
       (r.budget_usd IS NOT NULL
        OR EXISTS (SELECT 1 FROM trnflow.budgets b WHERE b.project = c.project)) AS budgeted,
       pj.job_uid
FROM claimed c
JOIN trnflow.runs r ON r.id = c.run_id
JOIN trnflow.projects pj ON pj.name = c.project;

-- name: ReserveBudgets
-- Reservations for freshly claimed attempts of budgeted runs and projects (migration 0033):
-- (stage, cap granted, or what it waits for: un-claimed without a ledger row). $3: the
-- claiming worker; $4: each attempt's estimate, NULL for one billing minute.
SELECT stage_id, cap_usd::text, waits_usd::text
FROM trnflow.reserve_budgets($1::bigint[], $2::int[], $3::uuid, $4::numeric[]);

-- name: RunsSpentOut
-- Of these runs, whose attempts were stopped at their spend caps, those with no other attempt
-- still running on a reservation: their budget is spent, they stop (CancelRun).
SELECT r.id FROM unnest($1::bigint[]) AS r(id)
WHERE NOT EXISTS (SELECT 1 FROM trnflow.running_stages q
                  JOIN trnflow.stages s ON s.id = q.stage_id
                  WHERE q.run_id = r.id AND s.state = 'running' AND s.attempt_reserved_usd > 0)
ORDER BY r.id;

-- name: TopUpBudget
-- A running attempt's reservation (and cap) raised by $4, never past what is left (migration
-- 0033); its cap now, NULL when it no longer runs under worker $3's lease.
SELECT trnflow.top_up_budget($1::bigint, $2::int, $3::uuid, $4::numeric)::text;

-- name: HeartbeatLeases
-- Renews the leases of the stages this worker runs ($3) in one statement and says which it
-- still holds; a stage missing from the result was taken over and must stop. A lease the
-- worker does not know it holds (a claim whose reply was lost) is left to expire and be
-- rescued. Rows another transaction has locked right now (usually this worker's own commit
-- of them) are skipped, not waited for: waiting would queue behind every commit and can
-- deadlock with its lock order. A skipped row is still reported held (the snapshot shows it
-- ours) and is renewed next time, long before its lease runs out. Also says which stages
-- belong to a cancelled run (and why).
-- Each stage comes with what its attempt last reported ($4..$7: progress, checkpointed, simulated
-- seconds run and still to run; -1 when it has said nothing): the live columns take it, and a
-- checkpoint becomes the stage's resume point at once, so it outlives the worker.
WITH report AS (
  SELECT * FROM unnest($3::bigint[], $4::float8[], $5::float8[], $6::float8[], $7::float8[])
    AS t(id, progress, checkpointed, sim_seconds, eta_s)),
mine AS MATERIALIZED (  -- locked once each (an IN subquery was re-run per row)
  SELECT id FROM trnflow.stages
  WHERE id = ANY($3::bigint[]) AND state = 'running' AND lease_owner = $1::uuid
  FOR UPDATE SKIP LOCKED),
renewed AS (
  UPDATE trnflow.stages s
  SET lease_expires_at = now() + make_interval(secs => $2), heartbeat_at = now(),
      live_progress = CASE WHEN r.progress >= 0 THEN r.progress ELSE s.live_progress END,
      live_sim_seconds = CASE WHEN r.progress >= 0 THEN r.sim_seconds ELSE s.live_sim_seconds END,
      live_eta_s = CASE WHEN r.progress >= 0 AND r.eta_s >= 0 THEN r.eta_s
                        WHEN r.progress >= 0 THEN NULL ELSE s.live_eta_s END,
      progress = greatest(s.progress, least(r.checkpointed, 1))
  FROM mine JOIN report r ON r.id = mine.id
  WHERE s.id = mine.id  -- locked above, so still running under this lease
  RETURNING s.id)
SELECT s.id, s.attempts, r.state = 'cancelled', coalesce(r.cancel_reason, '')
FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id
WHERE s.id = ANY($3::bigint[]) AND s.state = 'running' AND s.lease_owner = $1::uuid;

-- name: CompleteAttempts
-- Closes a batch of attempts. Each write is fenced on (stage, attempt, lease owner): a
-- result from a worker that lost its lease changes nothing. Returns the stages updated.
WITH input AS (
  SELECT * FROM unnest($1::bigint[], $2::int[], $3::uuid[], $4::text[], $5::text[],
                       $6::text[], $7::float8[], $8::float8[], $9::bigint[], $10::bigint[],
                       $11::bigint[], $12::bigint[], $13::float8[], $14::text[], $15::bigint[],
                       $16::text[])
    AS t(stage_id, attempt, owner, outcome, new_state, new_market, retry_in_s, sim_seconds,
         billed_seconds, cost_micros, wasted_micros, saved_micros, progress_to, message,
         baseline_micros, output_digest)),
updated AS (
  UPDATE trnflow.stages s
  SET state = trnflow.closing_state(i.new_state, s.stop_reason, r.state),
      market = i.new_market, lease_owner = NULL, lease_expires_at = NULL, stop_reason = NULL,
      progress = CASE WHEN i.new_state IN ('succeeded', 'cached') THEN 1 ELSE i.progress_to END,
      errors = s.errors + CASE WHEN i.outcome IN ('failed', 'timeout', 'infra_error',
                                                  'user_error') THEN 1 ELSE 0 END,
      preemptions = s.preemptions + CASE WHEN trnflow.is_preemption(i.outcome) THEN 1 ELSE 0 END,
      ready_at = CASE trnflow.closing_state(i.new_state, s.stop_reason, r.state)
                   WHEN 'retry_wait' THEN now() + make_interval(secs => i.retry_in_s)
                   WHEN 'ready' THEN now() ELSE s.ready_at END,
      retry_at = CASE trnflow.closing_state(i.new_state, s.stop_reason, r.state)
                   WHEN 'retry_wait' THEN now() + make_interval(secs => i.retry_in_s) END,
      finished_at = CASE WHEN trnflow.closing_state(i.new_state, s.stop_reason, r.state)
                              IN ('succeeded', 'cached', 'failed', 'cancelled') THEN now() END,
      output_digest = CASE WHEN i.new_state IN ('succeeded', 'cached')
                           THEN NULLIF(i.output_digest, '') END
  -- Cancel wins (trnflow.closing_state, migration 0024): a stage of a cancelled run never goes
  -- back to the queue. stop_reason is the stage row's own mark (cancel_run sets it), so a cancel
  -- that commits while this statement waits for the row is seen; the run's state covers one
  -- that committed before it began.
  FROM input i, trnflow.runs r
  WHERE s.id = i.stage_id AND r.id = s.run_id AND s.state = 'running' AND s.attempts = i.attempt
    AND s.lease_owner = i.owner
  RETURNING s.id, s.run_id, s.state, s.project, s.pool, s.priority, s.ready_at,
            i.attempt, i.outcome, i.sim_seconds, i.billed_seconds,
            i.cost_micros, i.wasted_micros, i.saved_micros, i.baseline_micros, i.progress_to,
            i.message, s.attempt_id, s.attempt_worker_id, s.attempt_worker_name,
            s.instance_type, s.instance_count, s.attempt_market, s.attempt_price_usd_hour,
            s.attempt_on_demand_price_usd_hour, s.attempt_started_at, s.attempt_queued_at,
            s.attempt_progress_from, s.attempt_cap_usd, s.attempt_reserved_usd,
            s.attempt_executor_job),
-- The attempt's ledger row, written once and whole: claim-time facts from the stage row
-- (which this statement's update left as they were), the result from the worker.
closed AS (
  INSERT INTO trnflow.attempts (id, stage_id, run_id, attempt, worker_id, worker_name,
                                instance_type, instance_count, market, price_usd_hour,
                                on_demand_price_usd_hour, started_at, queued_at, progress_from,
                                cap_usd, reserved_usd, executor_job, finished_at, outcome,
                                sim_seconds, billed_seconds, cost_usd, wasted_usd, saved_usd,
                                baseline_usd, progress_to, message)
  SELECT u.attempt_id, u.id, u.run_id, u.attempt, u.attempt_worker_id, u.attempt_worker_name,
         u.instance_type, u.instance_count, u.attempt_market, u.attempt_price_usd_hour,
         u.attempt_on_demand_price_usd_hour, u.attempt_started_at, u.attempt_queued_at,
         u.attempt_progress_from, u.attempt_cap_usd, u.attempt_reserved_usd,
         u.attempt_executor_job, now(), u.outcome, u.sim_seconds, u.billed_seconds,
         u.cost_micros / 1000000.0, u.wasted_micros / 1000000.0, u.saved_micros / 1000000.0,
         u.baseline_micros / 1000000.0, u.progress_to, NULLIF(u.message, '')
  FROM updated u),
unleased AS (
  DELETE FROM trnflow.running_stages q USING updated u
  WHERE q.run_id = u.run_id AND q.stage_id = u.id),
requeued AS (
  INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at,
                                    instance_count)
  SELECT run_id, id, project, pool, priority, ready_at, instance_count
  FROM updated WHERE state = 'ready')
SELECT id, run_id, state FROM updated;

-- name: ReleaseDependents
-- Stages whose needs all succeeded become ready; returns them (trnflow.release_dependents,
-- migrations 0020 and 0021: by index, whatever the statistics say). No notify: see NotifyReady.
SELECT id FROM trnflow.release_dependents($1::bigint[]) AS r(id);

-- name: NotifyReady
-- One notify per pool in which stages of $1 are still ready: those released by this
-- transaction that its own claims did not take.
SELECT count(pg_notify('trnflow_ready', pool))
FROM (SELECT DISTINCT pool FROM trnflow.stages
      WHERE id = ANY($1::bigint[]) AND state = 'ready') p;

-- name: SkipDescendants
-- Everything downstream of a stage that failed for good can never run.
WITH RECURSIVE down AS (
  SELECT d.stage_id FROM trnflow.stage_deps d WHERE d.needs_id = ANY($1::bigint[])
  UNION
  SELECT d.stage_id FROM trnflow.stage_deps d JOIN down ON d.needs_id = down.stage_id)
UPDATE trnflow.stages s SET state = 'skipped', finished_at = now(), pending_needs = 0
FROM down WHERE s.id = down.stage_id AND s.state = 'blocked';

-- name: FinishRuns
-- A run ends when none of its stages can still change; $1 NULL checks every running run.
UPDATE trnflow.runs r
SET finished_at = now(), state = trnflow.run_outcome(r.id)
WHERE r.state = 'running' AND ($1::bigint[] IS NULL OR r.id = ANY($1::bigint[]))
  AND NOT trnflow.run_has_unfinished(r.id)
RETURNING r.id, r.state;

-- name: RunsOnlyRunning
-- Of these unfinished runs, those with nothing left but running stages.
SELECT r.id FROM unnest($1::bigint[]) AS r(id)
WHERE NOT EXISTS (SELECT 1 FROM trnflow.ready_stages q WHERE q.run_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM trnflow.stages s WHERE s.run_id = r.id
                  AND (s.pending_needs > 0 OR s.retry_at IS NOT NULL));

-- name: LockRuns
SELECT id FROM trnflow.runs WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE;

-- name: PromoteRetries
-- retry_wait stages whose backoff has elapsed become ready and join the queue.
WITH promoted AS (
  UPDATE trnflow.stages SET state = 'ready', ready_at = now(), retry_at = NULL
  WHERE id IN (SELECT id FROM trnflow.stages WHERE retry_at <= now() AND state = 'retry_wait'
               ORDER BY retry_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
  RETURNING id, run_id, project, pool, priority, ready_at, instance_count),
queued AS (
  INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at,
                                    instance_count)
  SELECT run_id, id, project, pool, priority, ready_at, instance_count FROM promoted),
notified AS (SELECT pg_notify('trnflow_ready', pool) FROM (SELECT DISTINCT pool FROM promoted) p)
SELECT (SELECT count(*) FROM promoted), (SELECT count(*) FROM notified);

-- name: ExpiredLeases
-- Running stages whose worker stopped renewing; locked so one rescuer handles each. They are
-- billed up to their last heartbeat (what anyone knows ran), never past their spend cap: the
-- figure open_attempts showed live. Also says whether their run was cancelled.
SELECT s.id, s.run_id, s.attempts, s.lease_owner::text, s.errors, s.preemptions,
       s.spec::text, s.progress, s.instance_count,
       (s.attempt_price_usd_hour * 1000000)::bigint,
       trnflow.billable_sim_seconds(s.attempt_started_at, s.heartbeat_at, s.live_sim_seconds,
                                    r.speed, s.instance_count, s.attempt_price_usd_hour,
                                    s.attempt_cap_usd),  -- as open_attempts counts it live
       s.market, r.speed, s.attempt_progress_from, coalesce(s.live_progress, -1),
       (r.state = 'cancelled' OR s.stop_reason IS NOT NULL)
FROM trnflow.running_stages q
JOIN trnflow.stages s ON s.id = q.stage_id
JOIN trnflow.runs r ON r.id = s.run_id
WHERE s.state = 'running' AND s.lease_expires_at < now()
ORDER BY s.lease_expires_at
LIMIT 1000
FOR UPDATE OF s SKIP LOCKED;

-- name: RecordExecutorJob
-- The executor's job id of a running attempt, only while this worker holds its lease.
UPDATE trnflow.stages s SET attempt_executor_job = $3
WHERE s.id = $1 AND s.state = 'running' AND s.attempts = $2 AND s.lease_owner = $4::uuid

-- name: EarlierAttempts
-- A stage's attempts before $2, as the ledger has them: the Slurm executor's claim of an
-- attempt looks for an earlier attempt's job whose result no attempt has taken yet (one that
-- finished while no worker watched it is harvested, not run again: docs/executors.md). By the
-- ledger's (stage_id, attempt, started_at) key in each partition.
SELECT attempt, outcome, coalesce(executor_job, ''), coalesce(sim_seconds, 0)::float8
FROM trnflow.attempts WHERE stage_id = $1 AND attempt < $2 ORDER BY attempt;

-- name: EndMemberBlockers
-- Members' sessions a daemon has waited on for longer than $1 seconds, ended (migration 0023).
SELECT pid, member, waited_s FROM trnflow.end_member_blockers($1);

-- name: ReleaseDeadHolds
-- Runs whose holder (`trnflow run`, `watch --execute`) stopped or went silent for longer than
-- its lease (or never registered within one) are released: daemon workers may take their stages
-- now. Wakes the pools of their ready stages.
WITH released AS (
  DELETE FROM trnflow.held_runs h
  WHERE NOT EXISTS (SELECT 1 FROM trnflow.workers w
                    WHERE w.id = h.worker_id AND w.stopped_at IS NULL
                      AND w.heartbeat_at >= now() - make_interval(secs => coalesce(w.lease_s, 15)))
    AND h.since < now() - interval '15 seconds'
  RETURNING h.run_id),
notified AS (
  SELECT pg_notify('trnflow_ready', pool)
  FROM (SELECT DISTINCT q.pool FROM trnflow.ready_stages q JOIN released r ON r.run_id = q.run_id) p)
SELECT (SELECT count(*) FROM released), (SELECT count(*) FROM notified);

-- name: MakeAttemptsPartitionsAhead
-- The ledger's partitions of this UTC month and $1 months ahead, those missing made (migration
-- 0031); returns how many were made. The scheduler's `partitions` service, hourly.
SELECT trnflow.attempts_partitions_ahead($1::int);
