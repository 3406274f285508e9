-- 0033: budgets reserve what a stage will cost, not everything left (issue 45, "A budget
-- serialises a project"; docs/spend.md, "Reservations").
--
-- Before: a claimed attempt of a budgeted run or project reserved its expected cost when the
-- worker knew one (a simulated stage's model, a command's timeout) and everything the budget had
-- left when it did not (a `run:` stage without `timeout:`), so one such command held the whole
-- budget; every other claim of the project was handed back as a $0 `cancelled` attempt and
-- retried a second later (eight 5-second commands: 43 s and 119 ledger rows).
--
-- Now:
--   * reserve_budgets (replaced: it takes the worker's id and what each attempt wants) grants
--     each attempt its estimate (the worker's figure: a simulated stage's model, a command's
--     timeout and grace, its `estimate:` with a margin, else a default slice; never less than one
--     billing minute) when what is left covers it; the attempt's cap is its reservation;
--   * an attempt whose estimate is not covered while other open attempts hold reservations
--     waits WITHOUT a ledger row: the same statement un-claims it (state retry_wait, its attempt
--     number given back, out of running_stages), notes it in trnflow.budget_waits (how much it
--     needs, what was left, what others held) and writes one `budget` event when the wait
--     begins; an attempt that finds nothing held by others gets what is left (the budget's last
--     money: it runs until its cap and is stopped there, as before);
--   * top_up_budget lets a running attempt raise its reservation (and cap) in slices, atomically
--     against what is left (the run's row and the project's budget row locked, as
--     reserve_budgets locks them), never past it: when nothing is left the attempt is stopped at
--     its cap by its executor, exactly as before;
--   * a closing attempt (any ledger row: the worker's, the rescuer's) wakes the oldest budget
--     waits of its project that what is left now covers (retry_at = now(); the promoter makes
--     them ready), without waiting on any stage row another transaction holds; a wait not woken
--     retries on its own after 30 s, then 1, 2, 4, 8 and every 10 minutes (a missed wake;
--     `trnflow budget set` wakes the project's waits at once).
-- The waiting stage is a retry_wait stage like any other (the queue's rules, migration 0022,
-- hold: it is in neither ready_stages nor running_stages); cancel_run cancels it.

-- A stage waiting for its budget: daemons only (members read the `budget` event it wrote).
CREATE TABLE trnflow.budget_waits (
  stage_id  bigint PRIMARY KEY REFERENCES trnflow.stages(id) ON DELETE CASCADE,
  run_id    bigint NOT NULL,
  project   text NOT NULL,
  needs_usd numeric NOT NULL,  -- the reservation it asked for
  left_usd  numeric NOT NULL,  -- what the budget had left beside other attempts' reservations
  held_usd  numeric NOT NULL,  -- what other open attempts held
  holders   int NOT NULL,      -- how many they were
  since     timestamptz NOT NULL DEFAULT now(),  -- when this wait began
  checked_at timestamptz NOT NULL DEFAULT now(),  -- its latest try
  tries     int NOT NULL DEFAULT 0  -- tries since it began; its next one by itself: 30 s x 2^tries, 10 min at most
);
CREATE INDEX budget_waits_project ON trnflow.budget_waits (project, since, stage_id);
ALTER TABLE trnflow.budget_waits ENABLE ROW LEVEL SECURITY;
DO $$
DECLARE d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON trnflow.budget_waits TO %I', d);
  EXECUTE format('CREATE POLICY daemon_all ON trnflow.budget_waits TO %I USING (true) WITH CHECK (true)', d);
END $$;

-- What a run's attempt may still reserve: the least of what its run's budget_usd and its
-- project's budget (this period) have left after closed spend and the reservations of the other
-- open attempts (all but p_stage's), with what those others hold and how many they are, for
-- the budget that binds (scope 'run' or 'project'). No row's fields set: neither has a budget.
CREATE FUNCTION trnflow.budget_left(p_run bigint, p_stage bigint, OUT left_usd numeric,
                                    OUT held_usd numeric, OUT holders int, OUT scope text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
  b record;
  l numeric;
  h numeric;
  n int;
BEGIN
  SELECT x.id, x.project, x.budget_usd INTO r FROM trnflow.runs x WHERE x.id = p_run;
  IF r.id IS NULL THEN RETURN; END IF;
  IF r.budget_usd IS NOT NULL THEN
    SELECT coalesce(sum(x.reserved_usd), 0), count(x.reserved_usd) INTO h, n
    FROM trnflow.open_attempts x WHERE x.run_id = p_run AND x.stage_id IS DISTINCT FROM p_stage;
    l := r.budget_usd - coalesce((SELECT sum(a.cost_usd) FROM trnflow.attempts a
                                  WHERE a.run_id = p_run), 0) - h;
    left_usd := l; held_usd := h; holders := n; scope := 'run';
  END IF;
  SELECT bu.amount_usd, CASE WHEN bu.period = 'month'
                             THEN date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                             ELSE '-infinity'::timestamptz END AS start
  INTO b FROM trnflow.budgets bu WHERE bu.project = r.project;
  IF b.amount_usd IS NOT NULL THEN
    SELECT coalesce(sum(x.reserved_usd), 0), count(x.reserved_usd) INTO h, n
    FROM trnflow.open_attempts x JOIN trnflow.runs rr ON rr.id = x.run_id
    WHERE rr.project = r.project AND rr.state = 'running' AND x.stage_id IS DISTINCT FROM p_stage;
    l := b.amount_usd - trnflow.closed_spend(r.project, b.start) - h;
    IF left_usd IS NULL OR l < left_usd THEN
      left_usd := l; held_usd := h; holders := n; scope := 'project';
    END IF;
  END IF;
END $$;

-- An amount a daemon passed, made sane: NULL, NaN or negative is NULL, and at most 10^12.
CREATE FUNCTION trnflow.sane_usd(v numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN v IS NULL OR v = 'NaN'::numeric OR v < 0 THEN NULL ELSE least(v, 1e12) END
$$;

-- Reservations for freshly claimed attempts of budgeted runs and projects (the claim of worker
-- p_owner, attempts p_attempts): each asks for p_want (NULL: one billing minute), never less
-- than one billing minute at its price. Returns, per attempt, the reservation granted (its cap)
-- or what it waits for; both NULL: no budget limits it. A waiting attempt is un-claimed here,
-- in the same transaction, without a ledger row. Stages not running under p_owner's lease at
-- that attempt are left out (the worker must not run them).
DROP FUNCTION trnflow.reserve_budgets(bigint[], int[], numeric[]);
CREATE FUNCTION trnflow.reserve_budgets(p_stages bigint[], p_attempts int[], p_owner uuid,
                                        p_want numeric[])
RETURNS TABLE(stage_id bigint, cap_usd numeric, waits_usd numeric)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  i int;
  a record;
  l record;
  want numeric;
  minute numeric;
  grant_usd numeric;
  began boolean;
  tries int;
  cancelled boolean;
BEGIN
  IF coalesce(array_length(p_stages, 1), 0) > 10000
     OR coalesce(array_length(p_attempts, 1), 0) <> coalesce(array_length(p_stages, 1), 0)
     OR coalesce(array_length(p_want, 1), 0) <> coalesce(array_length(p_stages, 1), 0) THEN
    RAISE EXCEPTION 'reserve_budgets: stages, attempts and amounts differ in length (or over 10000)';
  END IF;
  -- Every run, then every project budget, in one order for every caller (two workers
  -- reserving for the same runs and projects, or a top-up beside them, cannot deadlock).
  PERFORM 1 FROM trnflow.runs r
  WHERE r.id IN (SELECT s.run_id FROM trnflow.stages s WHERE s.id = ANY(p_stages))
  ORDER BY r.id FOR UPDATE;
  PERFORM 1 FROM trnflow.budgets b
  WHERE b.project IN (SELECT s.project FROM trnflow.stages s WHERE s.id = ANY(p_stages))
  ORDER BY b.project FOR UPDATE;
  FOR i IN 1 .. coalesce(array_length(p_stages, 1), 0) LOOP
    SELECT s.id, s.run_id, s.project, s.instance_count, s.attempt_price_usd_hour AS price,
           s.stop_reason IS NOT NULL AS stopping
    INTO a FROM trnflow.stages s
    WHERE s.id = p_stages[i] AND s.attempts = p_attempts[i] AND s.state = 'running'
      AND s.lease_owner = p_owner;
    CONTINUE WHEN a.id IS NULL;
    SELECT r.state = 'cancelled' INTO cancelled FROM trnflow.runs r WHERE r.id = a.run_id FOR UPDATE;
    PERFORM 1 FROM trnflow.budgets WHERE project = a.project FOR UPDATE;
    SELECT * INTO l FROM trnflow.budget_left(a.run_id, a.id);
    IF l.left_usd IS NULL THEN  -- no budget limits it (any more): no cap
      stage_id := a.id; cap_usd := NULL; waits_usd := NULL;
      RETURN NEXT;
      CONTINUE;
    END IF;
    minute := coalesce(trnflow.charge_usd(a.price, a.instance_count, 60), 0);
    want := greatest(coalesce(trnflow.sane_usd(p_want[i]), minute), minute);
    IF l.left_usd >= want OR l.holders = 0 OR cancelled OR a.stopping THEN
      -- Covered; or nobody else holds anything, so waiting frees nothing: the budget's last
      -- money (below one billing minute the worker ends the attempt as budget_exceeded). A
      -- stage of a cancelled run is not put back to wait: its worker stops it (cancel wins).
      grant_usd := least(want, greatest(l.left_usd, 0));
      UPDATE trnflow.stages SET attempt_cap_usd = grant_usd, attempt_reserved_usd = grant_usd
      WHERE id = a.id;
      DELETE FROM trnflow.budget_waits w WHERE w.stage_id = a.id;
      stage_id := a.id; cap_usd := grant_usd; waits_usd := NULL;
      RETURN NEXT;
      CONTINUE;
    END IF;
    -- Wait, without a ledger row: the claim is undone (its attempt number given back) and the
    -- stage retries when an attempt of its project closes, or by itself after a backoff.
    INSERT INTO trnflow.budget_waits AS w (stage_id, run_id, project, needs_usd, left_usd,
                                           held_usd, holders)
    VALUES (a.id, a.run_id, a.project, want, greatest(l.left_usd, 0), l.held_usd, l.holders)
    ON CONFLICT (stage_id) DO UPDATE
      SET needs_usd = EXCLUDED.needs_usd, left_usd = EXCLUDED.left_usd,
          held_usd = EXCLUDED.held_usd, holders = EXCLUDED.holders, checked_at = now(),
          tries = least(w.tries + 1, 100)
    RETURNING w.tries INTO tries;
    began := tries = 0;
    UPDATE trnflow.stages s
    SET state = 'retry_wait', attempts = s.attempts - 1, lease_owner = NULL,
        lease_expires_at = NULL,
        retry_at = now() + make_interval(secs => least(30 * 2 ^ least(tries, 5), 600)),
        ready_at = now() + make_interval(secs => least(30 * 2 ^ least(tries, 5), 600)),
        attempt_cap_usd = NULL, attempt_reserved_usd = NULL, live_progress = NULL,
        live_sim_seconds = NULL, live_eta_s = NULL
    WHERE s.id = a.id;
    DELETE FROM trnflow.running_stages q WHERE q.run_id = a.run_id AND q.stage_id = a.id;
    IF began THEN
      INSERT INTO trnflow.events (run_id, stage_id, kind, message, data, project)
      VALUES (a.run_id, a.id, 'budget',
              'waiting for its budget: it reserves $' || round(want, 2) || ' and the '
              || CASE l.scope WHEN 'run' THEN 'run''s budget_usd' ELSE 'project''s budget' END
              || ' has $' || round(greatest(l.left_usd, 0), 2) || ' left beside $'
              || round(l.held_usd, 2) || ' held by ' || l.holders
              || ' running attempt(s); it starts when they close',
              jsonb_build_object('needs_usd', want, 'left_usd', greatest(l.left_usd, 0),
                                 'held_usd', l.held_usd, 'holders', l.holders,
                                 'scope', l.scope),
              a.project);
    END IF;
    stage_id := a.id; cap_usd := NULL; waits_usd := want;
    RETURN NEXT;
  END LOOP;
END $$;
REVOKE ALL ON FUNCTION trnflow.reserve_budgets(bigint[], int[], uuid, numeric[]) FROM PUBLIC;

-- A running attempt (stage p_stage, attempt p_attempt, under p_owner's lease) asks for p_want
-- more: its reservation and cap become what it held plus p_want, never past what its budgets
-- have left. Returns the new cap (unchanged when nothing is left), NULL when the attempt is not
-- running under that lease or is not budgeted.
CREATE FUNCTION trnflow.top_up_budget(p_stage bigint, p_attempt int, p_owner uuid,
                                      p_want numeric)
RETURNS numeric
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  a record;
  l record;
  want numeric := trnflow.sane_usd(p_want);
  total numeric;
BEGIN
  SELECT s.id, s.run_id, s.project, s.attempt_reserved_usd AS reserved INTO a
  FROM trnflow.stages s
  WHERE s.id = p_stage AND s.attempts = p_attempt AND s.state = 'running'
    AND s.lease_owner = p_owner;
  IF a.id IS NULL OR a.reserved IS NULL THEN RETURN NULL; END IF;
  IF want IS NULL OR want = 0 THEN RETURN a.reserved; END IF;
  -- The same order as reserve_budgets and cancel_run: the run, the budget, then the stage.
  PERFORM 1 FROM trnflow.runs WHERE id = a.run_id FOR UPDATE;
  PERFORM 1 FROM trnflow.budgets WHERE project = a.project FOR UPDATE;
  SELECT * INTO l FROM trnflow.budget_left(a.run_id, a.id);
  IF l.left_usd IS NULL THEN RETURN NULL; END IF;
  total := greatest(a.reserved, least(a.reserved + want, l.left_usd));
  UPDATE trnflow.stages s SET attempt_cap_usd = total, attempt_reserved_usd = total
  WHERE s.id = a.id AND s.attempts = p_attempt AND s.state = 'running'
    AND s.lease_owner = p_owner;
  IF NOT FOUND THEN RETURN NULL; END IF;
  RETURN total;
END $$;
REVOKE ALL ON FUNCTION trnflow.top_up_budget(bigint, int, uuid, numeric) FROM PUBLIC;

-- Closed attempts free their reservations: the oldest budget waits of their projects that what
-- is left now covers retry at once (at most 16 a statement, the first always when nothing is
-- held any more); stage rows another transaction holds are skipped (they retry after their backoff).
-- Waits whose stage no longer waits are forgotten.
CREATE FUNCTION trnflow.wake_budget_waits() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  p text;
  w record;
  l record;
  woken numeric;
  n int;
  ids bigint[];
BEGIN
  IF NOT EXISTS (SELECT 1 FROM trnflow.budget_waits) THEN RETURN NULL; END IF;
  DELETE FROM trnflow.budget_waits b
  WHERE b.stage_id IN (SELECT x.stage_id FROM trnflow.budget_waits x
                       WHERE NOT EXISTS (SELECT 1 FROM trnflow.stages s
                                         WHERE s.id = x.stage_id AND s.state = 'retry_wait')
                       FOR UPDATE SKIP LOCKED);
  FOR p IN SELECT DISTINCT r.project FROM new_rows x JOIN trnflow.runs r ON r.id = x.run_id
           WHERE EXISTS (SELECT 1 FROM trnflow.budget_waits b WHERE b.project = r.project) LOOP
    woken := 0;
    n := 0;
    ids := '{}';
    FOR w IN SELECT b.stage_id, b.run_id, b.needs_usd FROM trnflow.budget_waits b
             JOIN trnflow.stages s ON s.id = b.stage_id AND s.state = 'retry_wait'
             WHERE b.project = p ORDER BY b.since, b.stage_id LIMIT 16 LOOP
      SELECT * INTO l FROM trnflow.budget_left(w.run_id, w.stage_id);
      EXIT WHEN l.left_usd IS NOT NULL AND l.left_usd - woken < w.needs_usd
                AND NOT (n = 0 AND l.holders = 0);
      ids := ids || w.stage_id;
      woken := woken + w.needs_usd;
      n := n + 1;
    END LOOP;
    UPDATE trnflow.stages s SET retry_at = now(), ready_at = now()
    WHERE s.id IN (SELECT x.id FROM trnflow.stages x
                   WHERE x.id = ANY(ids) AND x.state = 'retry_wait' AND x.retry_at > now()
                   FOR NO KEY UPDATE SKIP LOCKED);
  END LOOP;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION trnflow.wake_budget_waits() FROM PUBLIC;
CREATE TRIGGER attempts_wake_budget_waits AFTER INSERT ON trnflow.attempts
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
  EXECUTE FUNCTION trnflow.wake_budget_waits();

-- A project's budget changed (`trnflow budget set`): its waits retry at once.
CREATE FUNCTION trnflow.wake_project_budget_waits(p_project text) RETURNS int
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
  WITH woken AS (
    UPDATE trnflow.stages s SET retry_at = now(), ready_at = now()
    WHERE s.id IN (SELECT x.id FROM trnflow.stages x JOIN trnflow.budget_waits w ON w.stage_id = x.id
                   WHERE w.project = p_project AND x.state = 'retry_wait'
                   FOR NO KEY UPDATE OF x SKIP LOCKED)
    RETURNING 1)
  SELECT count(*)::int FROM woken
$$;
REVOKE ALL ON FUNCTION trnflow.wake_project_budget_waits(text) FROM PUBLIC;

DO $$
DECLARE d text := trnflow.daemon_role();
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.wake_project_budget_waits(text) TO %I', d);
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.reserve_budgets(bigint[], int[], uuid, numeric[]) TO %I', d);
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.top_up_budget(bigint, int, uuid, numeric) TO %I', d);
  EXECUTE format('GRANT EXECUTE ON FUNCTION trnflow.budget_left(bigint, bigint) TO %I', d);
END $$;
REVOKE ALL ON FUNCTION trnflow.budget_left(bigint, bigint) FROM PUBLIC;
