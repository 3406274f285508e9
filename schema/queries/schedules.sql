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

-- name: RecordManualFire
-- A fire asked for now (`schedule run`): its slot is the moment, marked manual.
INSERT INTO trnflow.schedule_fires (schedule, slot, manual) VALUES ($1, clock_timestamp(), true)
RETURNING extract(epoch FROM slot)::float8;

-- name: SetManualFireRun
UPDATE trnflow.schedule_fires SET run_id = $3
WHERE schedule = $1 AND manual AND extract(epoch FROM slot)::float8 = $2;

-- name: SetFireRun
UPDATE trnflow.schedule_fires SET run_id = $3 WHERE schedule = $1 AND slot = to_timestamp($2);

-- name: AdvanceSchedule
UPDATE trnflow.schedules SET last_slot = greatest(last_slot, to_timestamp($2)) WHERE name = $1;

-- name: GetSchedule
-- One schedule, with its latest fire: (…ListSchedules' columns…, created_at, updated_at,
-- latest slot, when it fired, the state of its run).
SELECT s.name, s.file, s.source, s.params::text, s.project, s.cron, s.tz, s.catchup, s.speed,
       s.workdir, s.paused, extract(epoch FROM s.last_slot)::float8,
       coalesce(f.run_id, 0),
       (SELECT count(*) FROM trnflow.schedule_fires x WHERE x.schedule = s.name),
       to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       to_char(s.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       coalesce(to_char(f.slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), ''),
       coalesce(to_char(f.fired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), ''),
       coalesce(r.state, '')
FROM trnflow.schedules s
LEFT JOIN LATERAL (SELECT slot, fired_at, run_id FROM trnflow.schedule_fires
                   WHERE schedule = s.name ORDER BY slot DESC LIMIT 1) f ON true
LEFT JOIN trnflow.runs r ON r.id = f.run_id
WHERE s.name = $1;

-- name: UpdateSchedule
-- A new snapshot (and params, project, cron, tz). A new cron or time zone counts from now:
-- the slots it would have had before are not caught up.
UPDATE trnflow.schedules
SET file = $2, source = $3, params = $4::jsonb, project = $5, cron = $6, tz = $7, workdir = $8,
    last_slot = CASE WHEN cron <> $6 OR tz <> $7 THEN greatest(last_slot, now()) ELSE last_slot END,
    updated_at = now()
WHERE name = $1
RETURNING name;
