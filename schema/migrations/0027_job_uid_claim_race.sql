-- Two catalogs migrated at once on one server (or two test catalogs copied at once) raced for
-- the same free block of job uids: both tried CREATE ROLE trnflow_job_uids_<lo>, and the
-- loser failed with a duplicate role name instead of taking the next block. As 0023, and a
-- block whose claim role another session has just made is taken for claimed.
CREATE OR REPLACE FUNCTION trnflow.claim_default_job_uid_range() RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  lo bigint;
  used_lo bigint;
  used_hi bigint;
BEGIN
  IF (trnflow.job_uid_range()).lo IS NOT NULL THEN
    RETURN (SELECT value FROM trnflow.settings WHERE key = 'job_uid_range');
  END IF;
  SELECT min(job_uid), max(job_uid) INTO used_lo, used_hi FROM trnflow.projects;
  IF used_lo IS NOT NULL AND used_lo >= 100000 AND used_hi < (used_lo / 100000) * 100000 + 100000 THEN
    BEGIN
      RETURN trnflow.set_job_uid_range((used_lo / 100000) * 100000, (used_lo / 100000) * 100000 + 99999);
    EXCEPTION WHEN invalid_parameter_value OR unique_violation THEN
      NULL;  -- another catalog claims it: a free block for new projects below
    END;
  END IF;
  FOR i IN 0 .. 40000 LOOP
    lo := 200000 + i::bigint * 100000;
    EXIT WHEN lo + 99999 > 2147483646;
    BEGIN
      RETURN trnflow.set_job_uid_range(lo, lo + 99999, true);
    EXCEPTION WHEN invalid_parameter_value OR unique_violation THEN
      NULL;  -- claimed by another catalog, or being claimed right now: the next block
    END;
  END LOOP;
  RAISE EXCEPTION 'no free block of 100,000 job uids on this server' USING ERRCODE = '22023';
END $$;
