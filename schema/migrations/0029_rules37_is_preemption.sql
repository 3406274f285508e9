-- What a preemption is, in one place for SQL (issue 37): an attempt the market (or a dead
-- worker) ended, which draws on the stage's preemption budget instead of its errors. C++ asks
-- IsPreemption (common/stage_spec.cpp); tests/catalog_test.cpp holds the two to the same answer
-- for every outcome. Plain SQL, immutable, no SET clause: the planner inlines it, so the views
-- and CompleteAttempts plan as they did with the list written out.
CREATE FUNCTION trnflow.is_preemption(outcome text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT outcome IN ('spot_interruption', 'capacity_unavailable', 'lost')
$$;

-- The views that wrote the list out (0003, 0011, 0026) ask it instead; their columns are
-- unchanged.
CREATE OR REPLACE VIEW trnflow.interruption_waste WITH (security_invoker = true) AS
SELECT r.project, p.name AS pipeline, s.name AS stage, a.outcome, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE trnflow.is_preemption(a.outcome)
GROUP BY 1, 2, 3, 4;

CREATE OR REPLACE VIEW trnflow.interruption_waste_daily WITH (security_invoker = true) AS
SELECT r.project, (a.started_at AT TIME ZONE 'UTC')::date AS day,
       date_trunc('month', a.started_at AT TIME ZONE 'UTC')::date AS month,
       p.name AS pipeline, s.name AS stage, a.outcome, count(*) AS attempts,
       sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
JOIN trnflow.pipelines p ON p.id = r.pipeline_id
WHERE trnflow.is_preemption(a.outcome)
GROUP BY 1, 2, 3, 4, 5, 6;

CREATE OR REPLACE VIEW trnflow.event_log WITH (security_invoker = true) AS
SELECT e.at, e.kind, coalesce(e.project, r.project) AS project, e.run_id, s.name AS stage,
       NULL::int AS attempt, e.message, e.data
FROM trnflow.events e
LEFT JOIN trnflow.runs r ON r.id = e.run_id
LEFT JOIN trnflow.stages s ON s.id = e.stage_id
WHERE e.kind <> 'metrics'
UNION ALL
SELECT a.finished_at,
       CASE a.outcome WHEN 'spot_interruption' THEN 'interruption'
                      WHEN 'capacity_unavailable' THEN 'capacity'
                      WHEN 'lost' THEN 'lost'
                      ELSE 'budget' END,
       r.project, a.run_id, s.name, a.attempt,
       s.name || ' attempt ' || a.attempt || ': ' || a.outcome
         || coalesce(' (' || a.message || ')', ''),
       jsonb_build_object('outcome', a.outcome, 'cost_usd', a.cost_usd,
                          'wasted_usd', a.wasted_usd, 'instance_type', a.instance_type,
                          'market', a.market)
FROM trnflow.attempts a
JOIN trnflow.stages s ON s.id = a.stage_id
JOIN trnflow.runs r ON r.id = a.run_id
WHERE trnflow.is_preemption(a.outcome) OR a.outcome = 'budget_exceeded';
