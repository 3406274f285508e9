-- Releasing dependents without waking every worker for what the releasing one takes
-- (bench/analysis.md, 2026-11-27).
--
-- A worker closes a batch and, in the same transaction, claims for its free instances, so
-- the stages the batch released are usually claimed by that transaction. release_dependents
-- notified their pools anyway, before the claim: every worker listening on the pool (the
-- releasing one too) woke and ran a claim that found nothing, ~1 ms of PostgreSQL each, once
-- per completed batch of a chain (half the claims of 100 chains of 100). The function now
-- returns the stages it made ready and notifies no one; the caller notifies (NotifyReady,
-- schema/queries/stages.sql) for those still ready once its own claims have run.
DROP FUNCTION trnflow.release_dependents(bigint[]);
CREATE FUNCTION trnflow.release_dependents(p_done bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
  -- By index, whatever the statistics say (0020).
  RETURN QUERY
  WITH dec AS (
    SELECT d.stage_id, count(*) AS n
    FROM trnflow.stage_deps d JOIN unnest(p_done) AS done(id) ON d.needs_id = done.id
    GROUP BY d.stage_id),
  released AS (
    UPDATE trnflow.stages s
    SET pending_needs = s.pending_needs - dec.n,
        state = CASE WHEN s.state = 'blocked' AND s.pending_needs - dec.n = 0
                     THEN 'ready' ELSE s.state END,
        ready_at = CASE WHEN s.state = 'blocked' AND s.pending_needs - dec.n = 0
                        THEN now() ELSE s.ready_at END
    FROM dec WHERE s.id = dec.stage_id
    RETURNING s.id, s.state)
  SELECT id FROM released WHERE state = 'ready';
END $$;
-- The daemons complete attempts; members write only through submit_run and its peers.
REVOKE EXECUTE ON FUNCTION trnflow.release_dependents(bigint[]) FROM PUBLIC;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.release_dependents(bigint[]) TO %I',
                 trnflow.daemon_role());
END $$;
