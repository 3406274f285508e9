-- The compiled-artifact cache: who is building a key (single flight: one attempt compiles,
-- the others wait; a waiter takes over when the builder's attempt is gone), and whether a
-- run may retry a compilation that failed deterministically before.
ALTER TABLE trnflow.artifacts ADD COLUMN builder_stage bigint;
ALTER TABLE trnflow.artifacts ADD COLUMN builder_attempt int;
ALTER TABLE trnflow.artifacts ADD COLUMN failure text;
ALTER TABLE trnflow.artifacts ADD COLUMN path text;
ALTER TABLE trnflow.runs ADD COLUMN retry_failed_compilation boolean NOT NULL DEFAULT false;
CREATE INDEX artifacts_lru ON trnflow.artifacts (last_used_at) WHERE state = 'ready';
