-- What a running attempt has said about itself, renewed with every heartbeat of its lease:
-- how far it is, how many simulated seconds it has run and expects to run still, and when it
-- last said so. `show`, `watch` and `run` print them; when the worker dies, the rescuer bills
-- the lost attempt up to heartbeat_at (not to the lease's expiry) and counts as wasted only
-- the work after its last checkpoint. What the attempt has checkpointed is written to
-- stages.progress as it happens, so the next attempt resumes from it whatever became of this
-- one. All four are reset when an attempt is claimed; they mean nothing once it has ended.
ALTER TABLE trnflow.stages
  ADD COLUMN heartbeat_at timestamptz,
  ADD COLUMN live_progress float8,
  ADD COLUMN live_sim_seconds float8,
  ADD COLUMN live_eta_s float8;

-- What a running attempt has cost so far, the one figure every report adds to the ledger for
-- attempts still open (`runs`, `show`, `watch`, `budget ls`, `spend`, the budget guard): the
-- simulated time since it started at its price, billed as its ledger row will be (by the
-- second, one minute at least, rounded to the micro-dollar), never past its spend cap.
CREATE FUNCTION trnflow.running_cost_usd(started_at timestamptz, speed float8,
                                         instance_count int, price_usd_hour numeric,
                                         cap_usd numeric)
RETURNS numeric LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN cap_usd IS NULL THEN c ELSE least(c, cap_usd) END
  FROM (SELECT round(price_usd_hour * instance_count
                     * greatest(60, ceil(extract(epoch FROM (now() - started_at))::numeric
                                         * speed::numeric - 1e-9)) / 3600, 6) AS c) x
$$;

-- A worker that runs one run only (`trnflow run`, `watch --execute`) can run nobody else's
-- stages; "why isn't my stage running?" must not count it for them.
ALTER TABLE trnflow.workers ADD COLUMN only_run bigint;
-- Where the worker keeps logs, run dirs and checkpoints (its TRNFLOW_HOME): `trnflow logs` on
-- another host finds an attempt's log there when the path is shared, and names it when not.
ALTER TABLE trnflow.workers ADD COLUMN home text;

-- Events about a project as a whole (its budget's thresholds) name it, so its members see
-- them; those about a run stay visible with the run.
ALTER TABLE trnflow.events ADD COLUMN project text;
UPDATE trnflow.events SET project = data->>'project' WHERE run_id IS NULL AND data ? 'project';
DROP POLICY visible ON trnflow.events;
CREATE POLICY visible ON trnflow.events FOR SELECT
  USING (EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.id = run_id)
         OR (run_id IS NULL AND project IS NOT NULL AND trnflow.can_see_project(project)));
CREATE INDEX events_at ON trnflow.events (at) WHERE kind <> 'metrics';

-- `trnflow events`: what happened to the money and the stages, newest last. Budget notices
-- and stops come from the events table; interruptions, losses and budget stops of attempts
-- from the ledger itself, so nothing has to remember to write them twice. Read with the
-- reader's own rights (row-level security applies: a member sees their projects).
CREATE VIEW trnflow.event_log WITH (security_invoker = true) AS
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
WHERE a.outcome IN ('spot_interruption', 'capacity_unavailable', 'lost', 'budget_exceeded');

-- Projects' read roles see it too: ensure_project (which `project add` and `grant` call) now
-- grants it as well, and every project that exists gets it now.
ALTER FUNCTION trnflow.ensure_project(text) RENAME TO ensure_project_0008;
CREATE FUNCTION trnflow.ensure_project(p text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM trnflow.ensure_project_0008(p);
  EXECUTE format('GRANT SELECT ON trnflow.event_log TO %I', trnflow.project_role(p));
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.ensure_project(text) FROM PUBLIC;

DO $$
DECLARE p text;
BEGIN
  EXECUTE format('GRANT SELECT ON trnflow.event_log TO %I', trnflow.daemon_role());
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);
  END LOOP;
END $$;
