-- Makes a copy of a migrated catalog (CREATE DATABASE ... TEMPLATE, tests/test_db.cpp) a
-- catalog of its own, as if `trnflow db migrate` had just made it in this database: its own
-- catalog id, role prefix and roles (daemon, reader), the template's grants and policies moved
-- from the template's roles to its own, and a job uid range claimed for it. Run as the schema
-- owner in the copy, in one transaction. Anything else of the template's roles still in the copy
-- afterwards (a kind of grant this file does not know, an object they own) fails it, naming
-- it: a migration that adds one must add it here. tests/template_test.cpp compares a copy with
-- a freshly migrated catalog.
DO $$
DECLARE
  old_id text := (SELECT value FROM trnflow.settings WHERE key = 'catalog_id');
  old_prefix text := (SELECT value FROM trnflow.settings WHERE key = 'role_prefix');
  -- The rule of migration 0008.
  new_prefix text := CASE WHEN current_database() ~ '^[a-z][a-z0-9_]{0,31}$'
                          THEN current_database()
                          ELSE 'tf' || left(md5(current_database()), 10) END;
  r record;
  new_name text;
  left_over text;
BEGIN
  IF old_id IS NULL OR old_prefix IS NULL THEN
    RAISE EXCEPTION 'catalog_copy.sql: % is not a migrated catalog', current_database();
  END IF;
  UPDATE trnflow.settings SET value = new_prefix WHERE key = 'role_prefix';
  UPDATE trnflow.settings SET value = md5(random()::text || clock_timestamp()::text)
  WHERE key = 'catalog_id';
  DELETE FROM trnflow.settings WHERE key = 'job_uid_range';

  CREATE TEMP TABLE catalog_copy_roles (old oid PRIMARY KEY, new oid NOT NULL) ON COMMIT DROP;
  FOR r IN SELECT ro.oid, ro.rolname, ro.rolinherit, ro.rolcanlogin,
                  substring(d.description FROM '\): (.*)$') AS what
           FROM pg_roles ro
           JOIN pg_shdescription d ON d.objoid = ro.oid AND d.classoid = 'pg_authid'::regclass
           WHERE d.description LIKE 'trnflow catalog ' || old_id || ' (%): %'
             AND d.description NOT LIKE '%): job uids %'  -- the range is claimed below
  LOOP
    IF left(r.rolname, length(old_prefix) + 1) <> old_prefix || '_' THEN
      RAISE EXCEPTION 'catalog_copy.sql: the template''s role % does not start with its prefix %',
        r.rolname, old_prefix;
    END IF;
    new_name := trnflow.role_name(substr(r.rolname, length(old_prefix) + 2));
    PERFORM trnflow.ensure_catalog_role(new_name, r.what);
    EXECUTE format('ALTER ROLE %I %s %s', new_name,
                   CASE WHEN r.rolinherit THEN 'INHERIT' ELSE 'NOINHERIT' END,
                   CASE WHEN r.rolcanlogin THEN 'LOGIN' ELSE 'NOLOGIN' END);
    INSERT INTO catalog_copy_roles VALUES (r.oid, (SELECT oid FROM pg_roles WHERE rolname = new_name));
  END LOOP;

  -- Memberships between the catalog's roles and any other.
  FOR r IN SELECT coalesce(a.new, m.roleid)::regrole AS granted,
                  coalesce(b.new, m.member)::regrole AS member, m.admin_option
           FROM pg_auth_members m
           LEFT JOIN catalog_copy_roles a ON a.old = m.roleid
           LEFT JOIN catalog_copy_roles b ON b.old = m.member
           WHERE a.old IS NOT NULL OR b.old IS NOT NULL LOOP
    EXECUTE format('GRANT %s TO %s%s', r.granted, r.member,
                   CASE WHEN r.admin_option THEN ' WITH ADMIN OPTION' ELSE '' END);
  END LOOP;

  -- Grants: the schema, tables, views and sequences, columns, functions.
  FOR r IN
    SELECT format('%s ON SCHEMA %I', a.privilege_type, n.nspname) AS what, a.is_grantable,
           m.old, m.new
    FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
    JOIN catalog_copy_roles m ON m.old = a.grantee
    UNION ALL
    SELECT format('%s ON %s %s', a.privilege_type,
                  CASE WHEN c.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.oid::regclass),
           a.is_grantable, m.old, m.new
    FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN catalog_copy_roles m ON m.old = a.grantee
    UNION ALL
    SELECT format('%s (%I) ON TABLE %s', a.privilege_type, at.attname, at.attrelid::regclass),
           a.is_grantable, m.old, m.new
    FROM pg_attribute at CROSS JOIN LATERAL aclexplode(at.attacl) a
    JOIN catalog_copy_roles m ON m.old = a.grantee
    WHERE at.attnum > 0 AND NOT at.attisdropped
    UNION ALL
    SELECT format('%s ON ROUTINE %s', a.privilege_type, p.oid::regprocedure), a.is_grantable,
           m.old, m.new
    FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
    JOIN catalog_copy_roles m ON m.old = a.grantee
  LOOP
    EXECUTE format('GRANT %s TO %s%s', r.what, r.new::regrole,
                   CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    EXECUTE format('REVOKE %s FROM %s CASCADE', r.what, r.old::regrole);
  END LOOP;

  -- Policies name their roles.
  FOR r IN SELECT p.polname, p.polrelid::regclass AS rel,
                  (SELECT string_agg(CASE WHEN x = 0 THEN 'PUBLIC'
                                          ELSE coalesce(m.new, x)::regrole::text END, ', ')
                   FROM unnest(p.polroles) x LEFT JOIN catalog_copy_roles m ON m.old = x) AS roles
           FROM pg_policy p
           WHERE p.polroles && (SELECT array_agg(old) FROM catalog_copy_roles) LOOP
    EXECUTE format('ALTER POLICY %I ON %s TO %s', r.polname, r.rel, r.roles);
  END LOOP;

  SELECT string_agg(format('%s %s (%s)', s.classid::regclass, s.objid, s.refobjid::regrole), ', ')
  INTO left_over
  FROM pg_shdepend s
  WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND s.refobjid IN (SELECT old FROM catalog_copy_roles);
  IF left_over IS NOT NULL THEN
    RAISE EXCEPTION 'catalog_copy.sql: the copy still refers to the template''s roles: %', left_over
      USING HINT = 'a migration added a kind of grant or ownership tests/catalog_copy.sql does not move';
  END IF;

  -- Database privileges are not copied with a template: only this catalog's roles connect
  -- (migration 0024).
  EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I, %I', current_database(),
                 trnflow.daemon_role(), trnflow.reader_role());
  FOR r IN SELECT trnflow.project_role(name) AS role FROM trnflow.projects LOOP
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.role) THEN
      EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), r.role);
    END IF;
  END LOOP;

  -- As migration 0023 does for a new catalog: the first free block of job uids.
  PERFORM trnflow.claim_default_job_uid_range();
END $$;
