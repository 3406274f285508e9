-- name: AcquireArtifact
-- Become the builder of a key: when nobody has it, when its builder's attempt is no longer
-- running (the compiler died), when a run may retry a poisoned failure ($5), or when the
-- entry was found corrupt ($6 names the digest that failed verification). Returns a row only
-- to the new builder. $7: the builder's project ('' for an engine-produced compiled graph).
INSERT INTO trnflow.artifacts AS a (cache_key, state, builder_stage, builder_attempt, manifest,
                                    project)
VALUES ($1, 'building', $2, $3, $4::jsonb, NULLIF($7, ''))
ON CONFLICT (cache_key) DO UPDATE
SET state = 'building', builder_stage = EXCLUDED.builder_stage,
    builder_attempt = EXCLUDED.builder_attempt, manifest = EXCLUDED.manifest, failure = NULL,
    digest = NULL, bytes = NULL, path = NULL, project = EXCLUDED.project
WHERE (a.state = 'building' AND NOT EXISTS (
         SELECT 1 FROM trnflow.stages s
         WHERE s.id = a.builder_stage AND s.state = 'running' AND s.attempts = a.builder_attempt))
   OR (a.state = 'failed' AND $5)
   OR (a.state = 'ready' AND a.digest = $6)
RETURNING a.id;

-- name: FinishArtifact
-- The builder's result: ready with its digest, or failed (poisoned: a deterministic compiler
-- error, served to every later run until a key change or --retry-failed-compilation).
UPDATE trnflow.artifacts
SET state = $4, digest = NULLIF($5, ''), bytes = $6, path = NULLIF($7, ''),
    failure = NULLIF($8, ''), producer_attempt = (SELECT attempt_id FROM trnflow.stages  -- still open
                                                 WHERE id = $2 AND attempts = $3),
    last_used_at = now()
WHERE cache_key = $1 AND state = 'building' AND builder_stage = $2 AND builder_attempt = $3
RETURNING id;

-- name: ReleaseArtifact
-- The builder gave up for a reason that is not the compiler's (preempted, stopped): the key
-- is free for the next attempt.
DELETE FROM trnflow.artifacts
WHERE cache_key = $1 AND state = 'building' AND builder_stage = $2 AND builder_attempt = $3;

-- name: RecordArtifactHit
UPDATE trnflow.artifacts SET hits = hits + 1, last_used_at = now()
WHERE cache_key = $1 AND state = 'ready';

-- name: ListArtifacts
-- One entry ($1) or all ($1 NULL), most recently used first. The producing attempt's cost (what
-- a hit saves) is read for one entry only: the ledger is partitioned by month (0031), so a
-- lookup by attempt id probes every month's index, and a listing of 5,000 entries did it 5,000
-- times (220 ms at 10M attempts). A listing's rows carry 0.
SELECT cache_key, state, coalesce(digest, ''), coalesce(bytes, 0), coalesce(path, ''),
       coalesce(failure, ''), hits, manifest::text,
       coalesce(to_char(last_used_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), ''),
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       coalesce(builder_stage, 0),
       CASE WHEN $1::text IS NULL THEN 0
            ELSE coalesce((SELECT round(cost_usd * 1000000)::bigint FROM trnflow.attempts
                           WHERE id = producer_attempt), 0) END,
       coalesce(project, '')
FROM trnflow.artifacts
WHERE $1::text IS NULL OR cache_key = $1
ORDER BY last_used_at DESC NULLS LAST, cache_key;

-- name: DeleteArtifact
-- Never an entry being built.
DELETE FROM trnflow.artifacts WHERE cache_key = $1 AND state <> 'building' RETURNING coalesce(path, '');

-- name: StageCacheInputs
SELECT coalesce(NULLIF(spec->>'cache_inputs', ''), cache_inputs, '')
FROM trnflow.stages WHERE run_id = $1 AND name = $2;

-- name: RecordStageCacheInputs
UPDATE trnflow.stages SET cache_inputs = $3
WHERE id = $1 AND attempts = $2 AND state = 'running';

-- name: StageInputDigests
-- What a stage consumes: every stage upstream of it (not only its direct needs: a deploy
-- binds the weights its compile's graph was built for), each with the digest of what it
-- produced, or its attempt when that is unknown (so nothing keyed on it is served to a
-- later run).
WITH RECURSIVE up(id) AS (
  SELECT needs_id FROM trnflow.stage_deps WHERE stage_id = $1
  UNION
  SELECT d.needs_id FROM trnflow.stage_deps d JOIN up ON d.stage_id = up.id)
SELECT s.name, coalesce(s.output_digest, 'attempt:' || s.id || '/' || s.attempts)
FROM up JOIN trnflow.stages s ON s.id = up.id
ORDER BY s.name;

-- name: TrustedProjects
-- The projects whose entries project $1 may be served.
SELECT trusts FROM trnflow.cache_trust WHERE project = $1 ORDER BY trusts;

-- name: AddCacheTrust
-- Whether projects $1 and $2 exist, and whether the pair was new (added only when both do).
WITH known AS (
  SELECT EXISTS (SELECT 1 FROM trnflow.projects WHERE name = $1) AS has_project,
         EXISTS (SELECT 1 FROM trnflow.projects WHERE name = $2) AS has_trusts),
added AS (
  INSERT INTO trnflow.cache_trust (project, trusts)
  SELECT $1, $2 FROM known WHERE has_project AND has_trusts
  ON CONFLICT DO NOTHING
  RETURNING 1)
SELECT has_project, has_trusts, EXISTS (SELECT 1 FROM added) FROM known;

-- name: RemoveCacheTrust
DELETE FROM trnflow.cache_trust WHERE project = $1 AND trusts = $2 RETURNING 1;

-- name: ListCacheTrust
SELECT project, trusts FROM trnflow.cache_trust ORDER BY project, trusts;
