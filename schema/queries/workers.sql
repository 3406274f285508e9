-- name: RegisterWorker
-- A worker that runs one run only (`trnflow run`, `watch --execute`) holds it: daemon workers
-- skip its stages (trnflow.held_runs, migration 0024).
WITH registered AS (
  INSERT INTO trnflow.workers (id, host, pid, pools, only_run, home, lease_s, projects)
  VALUES ($1::uuid, $2, $3, $4::jsonb, NULLIF($5::bigint, 0), NULLIF($6, ''), $7, $8::text[])
  RETURNING id, only_run)
INSERT INTO trnflow.held_runs (run_id, worker_id)
SELECT only_run, id FROM registered WHERE only_run IS NOT NULL
ON CONFLICT (run_id) DO UPDATE SET worker_id = EXCLUDED.worker_id, since = now();

-- name: HoldRun
-- A run submitted by a foreground `trnflow run`: held from its first instant, before its
-- worker registers.
INSERT INTO trnflow.held_runs (run_id) VALUES ($1) ON CONFLICT (run_id) DO NOTHING;

-- name: ForgetWorkers
-- Removes workers that are not live (stopped, or silent for longer than their lease): all of
-- them ($1 = ''), or those whose id or host is $1.
DELETE FROM trnflow.workers
WHERE (stopped_at IS NOT NULL
       OR heartbeat_at < now() - make_interval(secs => coalesce(lease_s, 15)))
  AND ($1 = '' OR id::text = $1 OR host = $1)
RETURNING id::text, host, pid;

-- name: RunHolder
-- The process that holds a run (`trnflow run`, `watch --execute`): host, pid, seconds since its
-- last heartbeat, whether it stopped, its lease. No row: nobody holds it.
SELECT coalesce(w.host, ''), coalesce(w.pid, 0),
       coalesce(extract(epoch FROM (now() - w.heartbeat_at))::float8, -1),
       w.stopped_at IS NOT NULL, coalesce(w.lease_s, 15), w.id IS NOT NULL
FROM trnflow.held_runs h LEFT JOIN trnflow.workers w ON w.id = h.worker_id
WHERE h.run_id = $1;

-- name: WorkerHeartbeat
UPDATE trnflow.workers SET heartbeat_at = now() WHERE id = $1::uuid;

-- name: StopWorker
UPDATE trnflow.workers SET stopped_at = now() WHERE id = $1::uuid;

-- name: LiveWorkers
-- Workers that heartbeated in the last $1 seconds and have not stopped, with what they run now
-- (instances in use per pool), their lease (a worker silent for longer is dead) and the
-- projects they are reserved for ('': every project).
SELECT w.id::text, w.host, w.pid, w.pools::text, coalesce(w.only_run, 0),
       extract(epoch FROM (now() - w.heartbeat_at))::float8, coalesce(w.lease_s, 15),
       coalesce((SELECT jsonb_object_agg(u.pool, u.used)::text
                 FROM (SELECT s.pool, sum(s.instance_count) AS used
                       FROM trnflow.running_stages q JOIN trnflow.stages s ON s.id = q.stage_id
                       WHERE s.state = 'running' AND s.lease_owner = w.id
                       GROUP BY s.pool) u), '{}'),
       coalesce(array_to_string(w.projects, ','), '')
FROM trnflow.workers w
WHERE w.stopped_at IS NULL AND w.heartbeat_at > now() - make_interval(secs => $1)
ORDER BY w.started_at;

-- name: ExplainStage
-- The facts behind "why isn't this stage running?": its state and place, when its backoff
-- ends, the needs it still waits for, about how many ready stages go before it (its project's
-- own before it, and other projects' until their shares reach its project's: queue_position,
-- migration 0032), its project's share of the pool and caps, and its last attempt's outcome
-- and reason. ($1 run, $2 stage name.)
SELECT s.id, s.state, s.pool, s.instance_count, s.attempts, s.priority, r.state, r.project,
       coalesce(extract(epoch FROM (s.ready_at - now()))::float8, 0),
       coalesce((SELECT string_agg(n.name || ':' || n.state, ',' ORDER BY n.id)
                 FROM trnflow.stage_deps d JOIN trnflow.stages n ON n.id = d.needs_id
                 WHERE d.stage_id = s.id AND n.state NOT IN ('succeeded', 'cached')), ''),
       coalesce(qp.ahead_in_project + qp.ahead_elsewhere, 0),
       coalesce(l.outcome, ''), coalesce(l.message, ''),
       coalesce((SELECT w.host FROM trnflow.workers w WHERE w.id = s.lease_owner), ''),
       qp.project IS NOT NULL, coalesce(qp.weight, 1), coalesce(qp.running_in_pool, 0),
       coalesce(qp.running, 0), coalesce(qp.pool_running, 0), coalesce(qp.max_running, -1),
       coalesce(qp.pool_max_running, -1), coalesce(qp.ahead_in_project, 0),
       coalesce(qp.ahead_elsewhere, 0), coalesce(qp.projects_waiting, 0),
       coalesce(qp.running_stages_in_pool, 0)
FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id
LEFT JOIN LATERAL trnflow.queue_position(CASE WHEN s.state = 'ready' THEN s.id END) qp ON true
LEFT JOIN LATERAL (SELECT a.outcome, a.message FROM trnflow.attempts a
                   WHERE a.stage_id = s.id AND a.outcome IS NOT NULL
                   ORDER BY a.attempt DESC LIMIT 1) l ON true
WHERE s.run_id = $1 AND s.name = $2;
