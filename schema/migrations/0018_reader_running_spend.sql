-- The site's reader sees spend, and the spend of attempts still running is spend: `trnflow
-- spend` adds it under its table, and for the reader that query failed (no SELECT on
-- open_attempts, nor on the stage and run columns it reads: the cap an attempt may not pass
-- and the run's speed, which turn its time so far into dollars). Reading a view checks every
-- column it is built from, so the reader also gets the open attempt's worker id and executor
-- job id (ids, no secrets).
DO $$
DECLARE r text := trnflow.reader_role();
BEGIN
  EXECUTE format('GRANT SELECT (attempt_worker_id, attempt_queued_at, attempt_progress_from,
                  attempt_cap_usd, attempt_reserved_usd, attempt_executor_job)
                  ON trnflow.stages TO %I', r);
  EXECUTE format('GRANT SELECT (speed) ON trnflow.runs TO %I', r);
  EXECUTE format('GRANT SELECT ON trnflow.open_attempts TO %I', r);
END $$;
