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

-- (2) Members read their own logs from the CLI. A log is a file under the workers'
-- TRNFLOW_HOME, root's and 0700 (docs/security.md): a member's `trnflow logs` cannot open it,
-- and the dashboard (`trnflow serve`, which reads it as root and shows it to a member through
-- row-level security) could. So a member proves who they are to the dashboard through the
-- catalog: log_ticket, called with their own login, checks every argument and that the login
-- reads the run's project, and returns a random ticket for one attempt's log, good for one
-- request within a minute. `trnflow serve` spends it (spend_log_ticket, the daemons' login
-- only), then reads the log as it does for the dashboard, acting as that member. Only the
-- ticket's sha256 is kept: a dump of the table gives no ticket to spend.
CREATE TABLE trnflow.log_tickets (
  ticket_sha256 text PRIMARY KEY,
  member name NOT NULL,
  run_id bigint NOT NULL,
  stage_id bigint NOT NULL,
  stage text NOT NULL,
  attempt int NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX log_tickets_member ON trnflow.log_tickets (member);
ALTER TABLE trnflow.log_tickets ENABLE ROW LEVEL SECURITY;  -- no policy: the owner's functions only
REVOKE ALL ON trnflow.log_tickets FROM PUBLIC;

-- A ticket for the log of attempt `p_attempt` (null: the latest) of stage `p_stage` of run
-- `p_run`, for the calling login. Refused (42501, exit 4) unless that login is a member of the
-- run's project (the daemons' user reads logs as files); 22023 (exit 2) for a bad argument;
-- TF001 when the login holds 32 unspent tickets. Any login may call it: it checks who calls.
CREATE FUNCTION trnflow.log_ticket(p_run bigint, p_stage text, p_attempt int)
RETURNS TABLE (ticket text, attempt int, expires_in_s int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_stage bigint;
  v_kind text;
  v_attempts int;
  v_project text;
  v_attempt int;
  v_ticket text;
  v_problem text;
BEGIN
  IF p_run IS NULL OR p_run < 1 THEN
    RAISE EXCEPTION 'invalid run id %', coalesce(p_run::text, 'null') USING ERRCODE = '22023';
  END IF;
  v_problem := trnflow.stage_name_problem(p_stage);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION '%', v_problem USING ERRCODE = '22023';
  END IF;
  IF p_attempt IS NOT NULL AND NOT (p_attempt BETWEEN 1 AND 1000000) THEN
    RAISE EXCEPTION 'invalid attempt number %', p_attempt USING ERRCODE = '22023';
  END IF;
  SELECT s.id, s.kind, s.attempts, r.project INTO v_stage, v_kind, v_attempts, v_project
  FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id
  WHERE s.run_id = p_run AND s.name = p_stage;
  -- Not there, or not this login's to read: the same answer, so it tells nothing of others.
  IF v_project IS NULL OR NOT trnflow.has_role(session_user, trnflow.project_role(v_project)) THEN
    RAISE EXCEPTION 'run % has no stage "%" whose log this login may read', p_run, p_stage
      USING ERRCODE = '42501',
            HINT = 'a project''s members read its logs: trnflow project grant PROJECT ROLE --read';
  END IF;
  IF v_kind <> 'run' THEN
    RAISE EXCEPTION 'stage "%" is a % stage; only run: stages write logs', p_stage, v_kind
      USING ERRCODE = '22023';
  END IF;
  v_attempt := coalesce(p_attempt, v_attempts);
  IF v_attempt < 1 OR v_attempt > v_attempts THEN
    RAISE EXCEPTION 'stage "%" of run % has no attempt % (it has %)', p_stage, p_run, v_attempt,
      v_attempts USING ERRCODE = '22023';
  END IF;
  DELETE FROM trnflow.log_tickets WHERE expires_at < now();
  IF (SELECT count(*) FROM trnflow.log_tickets WHERE member = session_user) >= 32 THEN
    RAISE EXCEPTION 'this login holds 32 unspent log tickets; wait a minute for them to expire'
      USING ERRCODE = 'TF001';
  END IF;
  -- 244 random bits (gen_random_uuid draws from the server's strong random source).
  v_ticket := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
  INSERT INTO trnflow.log_tickets (ticket_sha256, member, run_id, stage_id, stage, attempt,
                                   expires_at)
  VALUES (encode(sha256(convert_to(v_ticket, 'UTF8')), 'hex'), session_user, p_run, v_stage,
          p_stage, v_attempt, now() + interval '60 seconds');
  RETURN QUERY SELECT v_ticket, v_attempt, 60;
END $$;

-- The ticket's member, run, stage and attempt, once: the row is deleted as it is read, so a
-- second use (or one after it expired) finds nothing. The daemons' login only (trnflow serve).
CREATE FUNCTION trnflow.spend_log_ticket(p_ticket text)
RETURNS TABLE (member name, run_id bigint, stage text, attempt int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT trnflow.has_role(session_user, trnflow.daemon_role()) THEN
    RAISE EXCEPTION 'log tickets are spent by trnflow serve (the daemons'' login) only'
      USING ERRCODE = '42501';
  END IF;
  IF p_ticket IS NULL OR p_ticket !~ '^[0-9a-f]{64}$' THEN
    RETURN;  -- not a ticket this catalog makes: nothing to spend
  END IF;
  -- An expired ticket is deleted too, and not returned.
  RETURN QUERY
  WITH gone AS (
    DELETE FROM trnflow.log_tickets t
    WHERE t.ticket_sha256 = encode(sha256(convert_to(p_ticket, 'UTF8')), 'hex')
    RETURNING t.member, t.run_id, t.stage, t.attempt, t.expires_at)
  SELECT g.member, g.run_id, g.stage, g.attempt FROM gone g WHERE g.expires_at >= now();
END $$;
