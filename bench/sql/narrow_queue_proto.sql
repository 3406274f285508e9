-- A prototype of the narrow queue in plain SQL (bench/analysis.md, 2026-11-26): the claim and
-- close of 100,000 stages as today's indexes make them (run_a) against a ready table that a
-- claim deletes from, a leases table, and a stages table with no index on state and
-- fillfactor 40 (run_b). Single session, a commit per step. Run it on a scratch database:
--   psql -d scratch -f bench/sql/narrow_queue_proto.sql
-- It prints each variant's seconds, WAL bytes per stage and HOT share.

\set ON_ERROR_STOP 1
DROP TABLE IF EXISTS wide, wide2, ready, leases;
CREATE TABLE wide (id bigint PRIMARY KEY, run_id bigint, name text, pool text, project text, priority int, state text,
  ready_at timestamptz, lease_owner uuid, lease_expires_at timestamptz, attempts int, spec jsonb, UNIQUE (run_id, name)) WITH (fillfactor = 85);
CREATE INDEX ON wide (pool, project, priority DESC, ready_at, id) WHERE state = 'ready';
CREATE INDEX ON wide (lease_owner) WHERE state = 'running';
CREATE INDEX ON wide (run_id) WHERE state IN ('blocked','ready','running','retry_wait');
CREATE INDEX ON wide (run_id) WHERE state IN ('cancelled','failed','skipped');
CREATE INDEX ON wide (ready_at) WHERE state = 'retry_wait';
CREATE TABLE wide2 (LIKE wide INCLUDING DEFAULTS) WITH (fillfactor = 40);
ALTER TABLE wide2 ADD PRIMARY KEY (id), ADD UNIQUE (run_id, name);
CREATE TABLE ready (stage_id bigint PRIMARY KEY, run_id bigint, pool text, project text, priority int, ready_at timestamptz, instance_count int);
CREATE INDEX ON ready (pool, project, priority DESC, ready_at, stage_id);
CREATE INDEX ON ready (run_id);
CREATE TABLE leases (stage_id bigint PRIMARY KEY, run_id bigint);
CREATE INDEX ON leases (run_id);
INSERT INTO wide SELECT g, 1, 's' || g, 'cpu', 'p', 0, 'ready', now(), NULL, NULL, 0,
  jsonb_build_object('name', 's' || g, 'pad', repeat('x', 650)) FROM generate_series(1, 100000) g;
INSERT INTO wide2 SELECT * FROM wide;
INSERT INTO ready SELECT id, run_id, pool, project, priority, ready_at, 1 FROM wide2;
VACUUM ANALYZE wide, wide2, ready, leases;
CHECKPOINT;

CREATE OR REPLACE PROCEDURE run_a() LANGUAGE plpgsql AS $$
DECLARE ids bigint[]; t0 timestamptz := clock_timestamp();
BEGIN
  LOOP
    SELECT array_agg(id) INTO ids FROM (SELECT id FROM wide WHERE state = 'ready' AND pool = 'cpu' AND project = 'p'
      ORDER BY priority DESC, ready_at, id LIMIT 128 FOR UPDATE SKIP LOCKED) x;
    EXIT WHEN ids IS NULL;
    UPDATE wide SET state = 'running', lease_owner = gen_random_uuid(), lease_expires_at = now(), attempts = attempts + 1
      WHERE id = ANY(ids);
    COMMIT;
    UPDATE wide SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL WHERE id = ANY(ids) AND state = 'running';
    COMMIT;
  END LOOP;
  RAISE NOTICE 'A: % s', extract(epoch FROM clock_timestamp() - t0);
END $$;
CREATE OR REPLACE PROCEDURE run_b() LANGUAGE plpgsql AS $$
DECLARE ids bigint[]; t0 timestamptz := clock_timestamp();
BEGIN
  LOOP
    WITH c AS (DELETE FROM ready WHERE stage_id IN (SELECT stage_id FROM ready WHERE pool = 'cpu' AND project = 'p'
      ORDER BY priority DESC, ready_at, stage_id LIMIT 128 FOR UPDATE SKIP LOCKED) RETURNING stage_id, run_id),
    l AS (INSERT INTO leases SELECT stage_id, run_id FROM c RETURNING stage_id)
    SELECT array_agg(stage_id) INTO ids FROM l;
    EXIT WHEN ids IS NULL;
    UPDATE wide2 SET state = 'running', lease_owner = gen_random_uuid(), lease_expires_at = now(), attempts = attempts + 1
      WHERE id = ANY(ids);
    COMMIT;
    DELETE FROM leases WHERE stage_id = ANY(ids);
    UPDATE wide2 SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL WHERE id = ANY(ids) AND state = 'running';
    COMMIT;
  END LOOP;
  RAISE NOTICE 'B: % s', extract(epoch FROM clock_timestamp() - t0);
END $$;

SELECT pg_current_wal_lsn() AS lsn0 \gset
CALL run_a();
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :'lsn0') / 100000 AS a_wal_bytes_per_stage;
CHECKPOINT;
SELECT pg_current_wal_lsn() AS lsn0 \gset
CALL run_b();
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :'lsn0') / 100000 AS b_wal_bytes_per_stage;
SELECT pg_stat_force_next_flush();
SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname IN ('wide', 'wide2');
