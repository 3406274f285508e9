-- Spend by day and by month, per stage and per preemption outcome (issue 35). spend_by_stage
-- and interruption_waste have no date column, so "this month by stage" had no answer in SQL;
-- they stay as they are (their names and columns are a contract), and these two views carry
-- the same rows split by the UTC day the attempt started (as spend_daily and the rollup date
-- an attempt) with that day's month beside it: GROUP BY month, or WHERE day >= ..., answers
-- the question.
CREATE VIEW trnflow.spend_by_stage_daily WITH (security_invoker = true) AS
SELECT r.project, (a.started_at AT TIME ZONE 'UTC')::date AS day,
       date_trunc('month', a.started_at AT TIME ZONE 'UTC')::date AS month,
       p.name AS pipeline, s.name AS stage, s.kind,
       count(DISTINCT a.run_id) AS runs, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd,
       sum(coalesce(a.saved_usd, 0)) AS saved_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
GROUP BY 1, 2, 3, 4, 5, 6;

CREATE VIEW trnflow.interruption_waste_daily WITH (security_invoker = true) AS
SELECT r.project, (a.started_at AT TIME ZONE 'UTC')::date AS day,
       date_trunc('month', a.started_at AT TIME ZONE 'UTC')::date AS month,
       p.name AS pipeline, s.name AS stage, a.outcome, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE a.outcome IN ('spot_interruption', 'capacity_unavailable', 'lost')
GROUP BY 1, 2, 3, 4, 5, 6;

-- Who reads them: whoever reads spend_by_stage and interruption_waste — the daemons, the
-- site's reader, and each project's group role (now, and from ensure_project, which
-- `project add` and `grant` call).
ALTER FUNCTION trnflow.ensure_project(text) RENAME TO ensure_project_0025;
CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0025(p);
  EXECUTE format('GRANT SELECT ON trnflow.spend_by_stage_daily, trnflow.interruption_waste_daily TO %I',
                 trnflow.project_role(p));
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.ensure_project(text) FROM PUBLIC;
DO $$
DECLARE p text;
BEGIN
  EXECUTE format('GRANT SELECT ON trnflow.spend_by_stage_daily, trnflow.interruption_waste_daily TO %I, %I',
                 trnflow.daemon_role(), trnflow.reader_role());
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;

-- `trnflow schedule run NAME` (issue 35): a fire now, outside the cron, recorded beside the
-- cron's fires at the moment it was asked for. It takes no slot of the cron's: last_slot and
-- the catch-up of missed slots are as they were.
ALTER TABLE trnflow.schedule_fires ADD COLUMN manual boolean NOT NULL DEFAULT false;
