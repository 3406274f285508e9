-- Cron schedules (`trnflow schedule`). A slot fires in the same transaction that records it
-- in schedule_fires, whose key makes every slot fire at most once, whichever scheduler leads
-- and however often it restarts.
CREATE TABLE trnflow.schedules (
  name        text PRIMARY KEY,
  file        text NOT NULL,               -- where the pipeline was added from, for people
  source      text NOT NULL,               -- the pipeline text, as validated when added
  params      jsonb NOT NULL DEFAULT '{}',
  project     text NOT NULL DEFAULT '',    -- overrides the pipeline's project when set
  cron        text NOT NULL,
  tz          text NOT NULL DEFAULT 'UTC',
  catchup     text NOT NULL DEFAULT 'latest' CHECK (catchup IN ('none', 'latest', 'all')),
  speed       double precision NOT NULL,
  workdir     text NOT NULL,
  paused      boolean NOT NULL DEFAULT false,
  last_slot   timestamptz NOT NULL DEFAULT now(),  -- slots after this one are due
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE trnflow.schedule_fires (
  schedule  text NOT NULL REFERENCES trnflow.schedules(name) ON DELETE CASCADE,
  slot      timestamptz NOT NULL,
  run_id    bigint REFERENCES trnflow.runs(id) ON DELETE SET NULL,
  fired_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (schedule, slot)
);
