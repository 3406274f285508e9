-- Whether a run still has work is asked on every completion: answer it from a narrow index
-- of unfinished stages instead of walking all of a run's stages (claim_bench showed the walk
-- growing with the run's size).
CREATE INDEX stages_unfinished ON trnflow.stages (run_id)
  WHERE state IN ('blocked', 'ready', 'running', 'retry_wait');
