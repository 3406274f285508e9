-- name: RegisterWorker
INSERT INTO trnflow.workers (id, host, pid, pools) VALUES ($1::uuid, $2, $3, $4::jsonb);

-- name: WorkerHeartbeat
UPDATE trnflow.workers SET heartbeat_at = now() WHERE id = $1::uuid;

-- name: StopWorker
UPDATE trnflow.workers SET stopped_at = now() WHERE id = $1::uuid;
