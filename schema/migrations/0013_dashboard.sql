-- The dashboard (`trnflow serve`, docs/serve.md): a feed of state changes for its live event
-- stream, and the right for the daemons' login to act as a project member so row-level
-- security decides what each person sees.

-- Every change of a run's or a stage's state, in order. `id` is the sequence the event stream
-- resumes from (SSE Last-Event-ID). One row per change, written by the statement-level
-- triggers below in the transaction that made the change, so a reader never sees a state the
-- catalog did not commit; one NOTIFY trnflow_changes (payload: the newest id) per statement.
CREATE TABLE trnflow.changes (
  id        bigserial PRIMARY KEY,
  at        timestamptz NOT NULL DEFAULT now(),
  project   text NOT NULL,
  run_id    bigint NOT NULL,
  stage_id  bigint,          -- NULL: the run itself
  stage     text,
  state     text NOT NULL
);
CREATE INDEX changes_at ON trnflow.changes (at);
ALTER TABLE trnflow.changes ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trnflow.changes FOR SELECT USING (trnflow.can_see_project(project));

-- Stages: only rows whose state changed (a heartbeat's progress is not a change). Inserts are
-- not recorded: a new run is one change of the run, and its stages are read with it.
CREATE FUNCTION trnflow.record_stage_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE newest bigint;
BEGIN
  WITH ins AS (
    INSERT INTO trnflow.changes (project, run_id, stage_id, stage, state)
    SELECT n.project, n.run_id, n.id, n.name, n.state
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state IS DISTINCT FROM n.state
    ORDER BY n.id
    RETURNING id)
  SELECT max(id) INTO newest FROM ins;
  IF newest IS NOT NULL THEN
    PERFORM pg_notify('trnflow_changes', newest::text);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER stages_changes AFTER UPDATE ON trnflow.stages
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.record_stage_changes();

CREATE FUNCTION trnflow.record_run_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE newest bigint;
BEGIN
  IF TG_OP = 'INSERT' THEN
    WITH ins AS (
      INSERT INTO trnflow.changes (project, run_id, state)
      SELECT n.project, n.id, n.state FROM new_rows n ORDER BY n.id
      RETURNING id)
    SELECT max(id) INTO newest FROM ins;
  ELSE
    WITH ins AS (
      INSERT INTO trnflow.changes (project, run_id, state)
      SELECT n.project, n.id, n.state FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE o.state IS DISTINCT FROM n.state ORDER BY n.id
      RETURNING id)
    SELECT max(id) INTO newest FROM ins;
  END IF;
  IF newest IS NOT NULL THEN
    PERFORM pg_notify('trnflow_changes', newest::text);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER runs_changes_insert AFTER INSERT ON trnflow.runs
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.record_run_changes();
CREATE TRIGGER runs_changes_update AFTER UPDATE ON trnflow.runs
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION trnflow.record_run_changes();

DO $$
DECLARE d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.changes TO %I USING (true) WITH CHECK (true)', d);
  EXECUTE format('GRANT SELECT, DELETE ON trnflow.changes TO %I', d);
END $$;

-- The dashboard runs as the daemons' login and serves each request as the PostgreSQL role of
-- the person behind it (`SET ROLE`), which needs membership in that role: every member a
-- project gets is also granted to the daemons' role. That hands the daemons nothing they lack
-- (they read and write every project already); `trnflow serve` itself refuses to act as a
-- role that is privileged, the daemons' or the reader's, or a member of no project.
ALTER FUNCTION trnflow.grant_project(text, text, boolean) RENAME TO grant_project_0008;
CREATE FUNCTION trnflow.grant_project(p text, member text, write boolean) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE role text;
BEGIN
  role := trnflow.grant_project_0008(p, member, write);
  EXECUTE format('GRANT %I TO %I', member, trnflow.daemon_role());
  RETURN role;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.grant_project(text, text, boolean),
  trnflow.grant_project_0008(text, text, boolean) FROM PUBLIC;

-- Members granted before this migration.
DO $$
DECLARE m text;
BEGIN
  FOR m IN
    SELECT DISTINCT mr.rolname FROM trnflow.projects p
    JOIN pg_roles g ON g.rolname IN (trnflow.project_role(p.name), trnflow.project_writer_role(p.name))
    JOIN pg_auth_members am ON am.roleid = g.oid
    JOIN pg_roles mr ON mr.oid = am.member
    WHERE mr.rolcanlogin AND NOT (mr.rolsuper OR mr.rolcreaterole OR mr.rolbypassrls)
      AND mr.rolname <> trnflow.daemon_role()
  LOOP
    EXECUTE format('GRANT %I TO %I', m, trnflow.daemon_role());
  END LOOP;
END $$;
