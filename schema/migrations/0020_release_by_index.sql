-- Releasing dependents by index, whatever the statistics say (bench/analysis.md, 2026-11-26
-- night).
--
-- A completed batch releases the stages that need it: look its ids up in stage_deps by
-- needs_id, decrement those stages' pending counts by primary key. On a catalog the planner
-- has no statistics for yet (a new one, or a big run just submitted, before autovacuum has
-- analyzed it) the named query was planned as a sequential scan of stage_deps and of stages
-- with hash joins: ~4 ms for every batch of a 10,000-stage run, a cost that grows with the
-- run, and the largest one in the chains benchmark (~129 us of PostgreSQL per stage). The
-- batch is at most a pool's capacity of ids and both lookups have their index, so probing
-- them is right at any size: the function forbids the sequential scans. (The change feed's
-- trigger it fires reads transition tables, which no such setting affects.)
CREATE FUNCTION trnflow.release_dependents(p_done bigint[]) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE pools_notified bigint;
BEGIN
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
    RETURNING s.pool, s.state)
  SELECT count(pg_notify('trnflow_ready', pool)) INTO pools_notified
  FROM (SELECT DISTINCT pool FROM released WHERE state = 'ready') p;
  RETURN pools_notified;
END $$;
-- The daemons complete attempts; members write only through submit_run and its peers.
REVOKE EXECUTE ON FUNCTION trnflow.release_dependents(bigint[]) FROM PUBLIC;
DO $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.release_dependents(bigint[]) TO %I',
                 trnflow.daemon_role());
END $$;
