-- The executor's own id for an attempt (a Slurm job id), written right after the job is
-- submitted, fenced on the attempt's lease: a worker that takes the stage over finds the job
-- and adopts it instead of submitting a second one, and people find it with Slurm's tools.
ALTER TABLE trnflow.attempts ADD COLUMN executor_job text;

DO $$ BEGIN
  EXECUTE format('GRANT UPDATE (executor_job) ON trnflow.attempts TO %I', trnflow.daemon_role());
END $$;
