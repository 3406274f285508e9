-- Cache tenancy. Several projects share one catalog and one fleet: a cached stage's entry is
-- its project's (its key includes the project, and `project` records who built it), served to
-- another project only when that project trusts the builder (cache_trust). A NULL project is
-- an entry the engine produced on its own terms (a compiled graph, keyed on the model's
-- architecture and shapes), shareable by every project.
ALTER TABLE trnflow.artifacts ADD COLUMN project text;

-- Entries of cached stages built before this migration: their keys have no project, so no
-- lookup reaches them any more; name their builder's project where it is known (so `cache ls`
-- shows them to the right people) and forget the rest. A compile's manifest has no
-- "parameters"; every other stage's has.
UPDATE trnflow.artifacts a SET project = r.project
FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id
WHERE s.id = a.builder_stage AND a.manifest ? 'parameters';
DELETE FROM trnflow.artifacts WHERE project IS NULL AND manifest ? 'parameters' AND state <> 'building';

-- `trnflow cache trust PROJECT TRUSTS`: PROJECT's cached stages may be served entries TRUSTS
-- built for the same inputs. One way: trusting is not being trusted.
CREATE TABLE trnflow.cache_trust (
  project     text REFERENCES trnflow.projects(name),
  trusts      text REFERENCES trnflow.projects(name),
  created_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (project, trusts),
  CHECK (project <> trusts)
);

-- A member sees its projects' entries and the engine's, and whom its projects trust; not
-- another project's commands, paths or hits. The daemon sees and writes all of it.
DROP POLICY visible ON trnflow.artifacts;
CREATE POLICY visible ON trnflow.artifacts FOR SELECT
  USING (project IS NULL OR trnflow.can_see_project(project));
ALTER TABLE trnflow.cache_trust ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trnflow.cache_trust FOR SELECT USING (trnflow.can_see_project(project));
DO $$
DECLARE
  d text := trnflow.daemon_role();
  p text;
BEGIN
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.cache_trust TO %I USING (true) WITH CHECK (true)', d);
  EXECUTE format('GRANT SELECT, INSERT, DELETE ON trnflow.cache_trust TO %I', d);
  FOR p IN SELECT name FROM trnflow.projects LOOP
    PERFORM trnflow.ensure_project(p);  -- grants cache_trust now that it exists
  END LOOP;
END $$;
