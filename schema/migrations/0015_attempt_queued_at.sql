-- When the stage an attempt ran had become ready: its queue wait is started_at - queued_at
-- (the dashboard's timeline, the queue-wait histogram of /metrics). Written by the claim from
-- the stage's ready_at, which the claim does not change. NULL for attempts claimed before this
-- migration (they are left out of the histogram) and for rows written by anything else.
-- Access needs no new grant: the daemons' INSERT and every reader's SELECT on attempts are
-- table-wide (the reader's column list in 0003 is not extended: it reads spend, not queues).
ALTER TABLE trnflow.attempts ADD COLUMN queued_at timestamptz;
