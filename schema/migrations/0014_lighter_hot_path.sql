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
