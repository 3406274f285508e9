-- A lighter hot path (bench/analysis.md says where each change came from).
--
-- Foreign keys checked a row per attempt and per edge for nothing: attempts are written only by
-- the claim, from stage rows it has just locked, edges only by submit, from the stages the same
-- statement inserts, and the ledger never deletes runs, stages or attempts. Dropping them
-- removes two lookups (and two row locks) from every claim and two from every edge submitted.
ALTER TABLE trnflow.attempts DROP CONSTRAINT IF EXISTS attempts_stage_id_fkey;
ALTER TABLE trnflow.attempts DROP CONSTRAINT IF EXISTS attempts_run_id_fkey;
ALTER TABLE trnflow.stage_deps DROP CONSTRAINT IF EXISTS stage_deps_stage_id_fkey;
ALTER TABLE trnflow.stage_deps DROP CONSTRAINT IF EXISTS stage_deps_needs_id_fkey;

-- A heartbeat renews a lease every few seconds for every running stage. With the lease's expiry
-- in an index, each renewal was a non-HOT update that added an entry to every index of
-- `stages`; now no index holds a column a heartbeat writes, so renewals are HOT updates
-- (in place on the page, no index touched). The rescuer finds expired leases among the running
-- stages (a few thousand at most), through the index of running stages by lease owner.
DROP INDEX IF EXISTS trnflow.stages_lease_expiry;
CREATE INDEX IF NOT EXISTS stages_leased ON trnflow.stages (lease_owner) WHERE state = 'running';
-- Room on each page for a stage's new versions to stay there (HOT needs it).
ALTER TABLE trnflow.stages SET (fillfactor = 85);

-- The statement triggers compared a statement's old and new rows with a join that, planned
-- without statistics on the transition tables, was a nested loop: quadratic in the rows one
-- statement changes. Releasing the 9,998 stages after a fan-out's root took 16 s in the change
-- feed's trigger. The feed's join is hashed now.
ALTER FUNCTION trnflow.record_stage_changes() SET enable_nestloop = off;
ALTER FUNCTION trnflow.record_run_changes() SET enable_nestloop = off;
-- The rollup needs no join at all: attempts_closed_once refuses any update of a closed attempt,
-- so every row a statement leaves closed was open before it.
CREATE OR REPLACE FUNCTION trnflow.roll_up_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO trnflow.spend_rollup AS r
  SELECT ru.project, (n.started_at AT TIME ZONE 'UTC')::date, p.name, s.name, s.kind,
         n.instance_type, n.market, count(*), sum(coalesce(n.billed_seconds, 0)),
         sum(coalesce(n.cost_usd, 0)), sum(coalesce(n.wasted_usd, 0)),
         sum(coalesce(n.saved_usd, 0)), sum(trnflow.on_demand_usd(n)),
         sum(coalesce(n.baseline_usd, n.cost_usd, 0))
  FROM new_rows n
  JOIN trnflow.stages s ON s.id = n.stage_id
  JOIN trnflow.runs ru ON ru.id = n.run_id
  JOIN trnflow.pipelines p ON p.id = ru.pipeline_id
  WHERE n.outcome IS NOT NULL
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
