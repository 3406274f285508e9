-- 0024: the stage bound the parser applies before it expands a matrix.
--
-- Stage counts multiply before anything is expanded (matrix products × aliases), so a 1.9 KB
-- file could name a million stages and cost gigabytes before submit_run's quota refused it.
-- The parser now counts the stages first and refuses past the project's room, which it reads
-- here: the same quotas and the same count of unfinished stages submit_run_0022 checks (that
-- check stays, under the project's row lock, for the submit that races another).
-- A project that does not exist yet has the column defaults; a login that may not write to the
-- project learns only its per-run quota (its submit is refused for permission anyway).
CREATE FUNCTION trnflow.stage_room(p_project text, OUT max_stages_per_run int,
  OUT max_queued_stages int, OUT unfinished bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(p.max_stages_per_run, 250000), coalesce(p.max_queued_stages, 1000000),
         CASE WHEN p.name IS NULL OR NOT trnflow.may_write(p_project) THEN 0
         ELSE (SELECT count(*) FROM trnflow.ready_stages WHERE project = p_project)
            + (SELECT count(*) FROM trnflow.running_stages WHERE project = p_project)
            + (SELECT count(*) FROM trnflow.runs r JOIN trnflow.stages s ON s.run_id = r.id
               WHERE r.project = p_project AND r.state = 'running'
                 AND (s.pending_needs > 0 OR s.retry_at IS NOT NULL))
         END
  FROM (SELECT 1) one LEFT JOIN trnflow.projects p ON p.name = p_project
$$;

