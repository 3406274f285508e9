-- name: StageHistory
-- What `plan` and budget admission know of a run: stage without `estimate:`: per stage name
-- ($3), the median simulated seconds of its succeeded attempts in the latest 20 runs of
-- pipeline $2 in project $1 that ran it to success, and how many runs that is; and the median
-- wall seconds the command took (simulated seconds / the run's speed), for `plan --speed`.
SELECT name, percentile_cont(0.5) WITHIN GROUP (ORDER BY sim_seconds), count(*)::int,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY sim_seconds / speed)
FROM (SELECT s.name, a.sim_seconds, r.speed,
             row_number() OVER (PARTITION BY s.name ORDER BY a.finished_at DESC, a.id DESC) AS recent
      FROM trnflow.runs r
      JOIN trnflow.pipelines p ON p.id = r.pipeline_id
      JOIN trnflow.stages s ON s.run_id = r.id
      JOIN trnflow.attempts a ON a.stage_id = s.id
      WHERE r.project = $1 AND p.name = $2 AND s.name = ANY($3::text[]) AND s.kind = 'run'
        AND a.outcome = 'succeeded' AND a.sim_seconds > 0) x
WHERE recent <= 20
GROUP BY name;
