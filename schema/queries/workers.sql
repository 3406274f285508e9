-- name: RegisterWorker
INSERT INTO trnflow.workers (id, host, pid, pools, only_run, home)
VALUES ($1::uuid, $2, $3, $4::jsonb, NULLIF($5::bigint, 0), NULLIF($6, ''));

-- name: WorkerHeartbeat
UPDATE trnflow.workers SET heartbeat_at = now() WHERE id = $1::uuid;

-- name: StopWorker
UPDATE trnflow.workers SET stopped_at = now() WHERE id = $1::uuid;

-- name: LiveWorkers
-- Workers that heartbeated in the last $1 seconds and have not stopped, with what they run now
-- (instances in use per pool).
SELECT w.id::text, w.host, w.pid, w.pools::text, coalesce(w.only_run, 0),
       extract(epoch FROM (now() - w.heartbeat_at))::float8,
       coalesce((SELECT jsonb_object_agg(u.pool, u.used)::text
                 FROM (SELECT s.pool, sum(s.instance_count) AS used
                       FROM trnflow.running_stages q JOIN trnflow.stages s ON s.id = q.stage_id
                       WHERE s.state = 'running' AND s.lease_owner = w.id
                       GROUP BY s.pool) u), '{}')
FROM trnflow.workers w
WHERE w.stopped_at IS NULL AND w.heartbeat_at > now() - make_interval(secs => $1)
ORDER BY w.started_at;

-- name: ExplainStage
-- The facts behind "why isn't this stage running?": its state and place, when its backoff
-- ends, the needs it still waits for, how many ready stages of its pool go before it, and its
-- last attempt's outcome and reason. ($1 run, $2 stage name.)
SELECT s.id, s.state, s.pool, s.instance_count, s.attempts, s.priority, r.state, r.project,
       coalesce(extract(epoch FROM (s.ready_at - now()))::float8, 0),
       coalesce((SELECT string_agg(n.name || ':' || n.state, ',' ORDER BY n.id)
                 FROM trnflow.stage_deps d JOIN trnflow.stages n ON n.id = d.needs_id
                 WHERE d.stage_id = s.id AND n.state NOT IN ('succeeded', 'cached')), ''),
       CASE WHEN s.state = 'ready'
            THEN (SELECT count(*) FROM trnflow.ready_stages q
                  WHERE q.pool = s.pool
                    AND (q.priority, -extract(epoch FROM q.ready_at), -q.stage_id)
                        > (s.priority, -extract(epoch FROM s.ready_at), -s.id))
            ELSE 0 END,
       coalesce(l.outcome, ''), coalesce(l.message, ''),
       coalesce((SELECT w.host FROM trnflow.workers w WHERE w.id = s.lease_owner), '')
FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id
LEFT JOIN LATERAL (SELECT a.outcome, a.message FROM trnflow.attempts a
                   WHERE a.stage_id = s.id AND a.outcome IS NOT NULL
                   ORDER BY a.attempt DESC LIMIT 1) l ON true
WHERE s.run_id = $1 AND s.name = $2;
