-- name: AddSchedule
INSERT INTO trnflow.schedules (name, file, source, params, project, cron, tz, catchup, speed,
                               workdir)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: ListSchedules
SELECT s.name, s.file, s.source, s.params::text, s.project, s.cron, s.tz, s.catchup, s.speed,
       s.workdir, s.paused, extract(epoch FROM s.last_slot)::float8,
       coalesce((SELECT f.run_id FROM trnflow.schedule_fires f WHERE f.schedule = s.name
                 ORDER BY f.slot DESC LIMIT 1), 0),
       (SELECT count(*) FROM trnflow.schedule_fires f WHERE f.schedule = s.name)
FROM trnflow.schedules s ORDER BY s.name;

-- name: PauseSchedule
-- Resuming starts from now: slots while paused are not caught up.
UPDATE trnflow.schedules
SET paused = $2, last_slot = CASE WHEN NOT $2 THEN greatest(last_slot, now()) ELSE last_slot END
WHERE name = $1 RETURNING name;

-- name: RemoveSchedule
DELETE FROM trnflow.schedules WHERE name = $1 RETURNING name;

-- name: RecordFire
INSERT INTO trnflow.schedule_fires (schedule, slot) VALUES ($1, to_timestamp($2))
ON CONFLICT (schedule, slot) DO NOTHING RETURNING slot;

-- name: SetFireRun
UPDATE trnflow.schedule_fires SET run_id = $3 WHERE schedule = $1 AND slot = to_timestamp($2);

-- name: AdvanceSchedule
UPDATE trnflow.schedules SET last_slot = greatest(last_slot, to_timestamp($2)) WHERE name = $1;
