-- Issue 35. (1) Project names may hold '_', as logins, roles and schedules do; a name whose
-- PostgreSQL roles another project's would be is refused, naming that project.
--
-- A project's roles spell '-' as '_' (trnflow.project_role), so 'a-b' and 'a_b' would share
-- trnflow_project_a_b; and a project's write role is its read role plus '_write', so 'x-write'
-- (or 'x_write') would be given project x's write role as its read role. Both are refused when
-- the second project is created: the trigger below names the project already there, and a
-- unique index on the spelling makes two creations racing with 'a-b' and 'a_b' fail too.

-- The existing project whose roles `p`'s would be (or hold), or null. Owner's rights: it looks
-- at every project, which no member may list.
CREATE FUNCTION trnflow.project_name_clash(p text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT q.name FROM trnflow.projects q
  WHERE q.name <> p
    AND (replace(q.name, '-', '_') = replace(p, '-', '_')
         OR replace(q.name, '-', '_') = replace(p, '-', '_') || '_write'
         OR replace(q.name, '-', '_') || '_write' = replace(p, '-', '_'))
  ORDER BY q.name LIMIT 1
$$;
REVOKE EXECUTE ON FUNCTION trnflow.project_name_clash(text) FROM PUBLIC;

CREATE FUNCTION trnflow.refuse_project_name_clash() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE other text := trnflow.project_name_clash(NEW.name);
BEGIN
  IF other IS NOT NULL THEN
    RAISE EXCEPTION 'project name "%" clashes with the existing project "%": %', NEW.name, other,
      CASE WHEN replace(other, '-', '_') = replace(NEW.name, '-', '_')
           THEN format('both would use the PostgreSQL role %s (a project''s roles spell - as _)',
                       trnflow.project_role(NEW.name))
           ELSE format('the role %s would be both one''s read role and the other''s write role',
                       CASE WHEN length(other) > length(NEW.name) THEN trnflow.project_role(other)
                            ELSE trnflow.project_role(NEW.name) END)
      END
      USING ERRCODE = '22023',
            HINT = format('use the project "%s", or choose a name that differs from it in more '
                          'than - and _ (and a _write ending)', other);
  END IF;
  RETURN NEW;
END $$;
REVOKE EXECUTE ON FUNCTION trnflow.refuse_project_name_clash() FROM PUBLIC;

CREATE TRIGGER projects_name_clash BEFORE INSERT OR UPDATE OF name ON trnflow.projects
FOR EACH ROW EXECUTE FUNCTION trnflow.refuse_project_name_clash();

CREATE UNIQUE INDEX projects_role_spelling ON trnflow.projects ((replace(name, '-', '_')));

-- The rule itself, where SQL checks it: ensure_project (project add and grant) and submit_run
-- (a run's project). Only the project-name test changes in each, so the live definitions are
-- rewritten rather than copied here; each must have held the old test exactly once.
DO $$
DECLARE
  f regprocedure;
  def text;
  old text := '[a-z0-9][a-z0-9-]{0,62}$';
BEGIN
  FOREACH f IN ARRAY ARRAY[
    'trnflow.ensure_project_0008(text)'::regprocedure,
    'trnflow.submit_run_0022(text, text, text, text, jsonb, float8, bigint, float8, numeric, text,
      boolean, text[], text[], text[], text[], int[], text[], int[], jsonb[], int[], int[])'::regprocedure]
  LOOP
    def := pg_get_functiondef(f);
    IF (length(def) - length(replace(def, old, ''))) / length(old) <> 1 THEN
      RAISE EXCEPTION 'migration 0028: % does not hold the old project name test once', f;
    END IF;
    EXECUTE replace(replace(def, old, '[a-z0-9][a-z0-9_-]{0,62}$'),
                    'use lowercase letters, digits and -, starting',
                    'use lowercase letters, digits, - and _, starting');
  END LOOP;
END $$;
