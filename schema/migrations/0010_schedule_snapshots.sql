-- A schedule keeps a snapshot of its pipeline (the text `schedule add` validated), not a path:
-- the scheduler that fires it may run on a host without the file, or with another version of
-- it. `schedule update` takes a new snapshot; updated_at says when the current one was taken.
-- Existing schedules' snapshots were taken when they were added.
ALTER TABLE trnflow.schedules ADD COLUMN updated_at timestamptz;
UPDATE trnflow.schedules SET updated_at = created_at;
ALTER TABLE trnflow.schedules ALTER COLUMN updated_at SET NOT NULL,
                              ALTER COLUMN updated_at SET DEFAULT now();
-- Access is unchanged and needs no new grant: the daemon's INSERT, UPDATE and SELECT on the
-- table and the project roles' SELECT (0008) are table-wide, so they cover the new column, and
-- the row policies (daemon_all; members see their projects' schedules) are per row.
