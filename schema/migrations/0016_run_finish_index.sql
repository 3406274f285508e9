-- When a run's last stage closes, FinishRuns decides how it ended by asking whether any of its
-- stages was cancelled, failed or skipped. No index answered that by run, so with a large
-- catalog the planner scanned the whole stages table: claim_bench found one ~1.2 s stall per
-- finished run with 3M finished stages in history. Stages that end badly are few; this partial
-- index holds only them.
CREATE INDEX IF NOT EXISTS stages_ended_badly ON trnflow.stages (run_id)
  WHERE state IN ('cancelled', 'failed', 'skipped');
