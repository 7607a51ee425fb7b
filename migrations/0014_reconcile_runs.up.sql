-- One row per reconcile job run, for the operations overview: what it examined and changed. The
-- jobs delete their own old rows (the newest 1,000 within 7 days are kept).
CREATE TABLE reconcile_runs (
    id          bigserial PRIMARY KEY,
    job         text NOT NULL,
    network     text NOT NULL DEFAULT '',   -- '': every configured network
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    examined    integer NOT NULL DEFAULT 0,
    changed     jsonb NOT NULL DEFAULT '{}', -- counts by kind: {"mined": 2, "final": 5}
    error       text                          -- scrubbed of URLs; NULL: the run succeeded
);
CREATE INDEX reconcile_runs_started ON reconcile_runs (started_at DESC);

-- The overview reads the last hour of deliveries every few seconds (the last hour of settlements
-- is read through 0015's (created_at, id)).
CREATE INDEX webhook_deliveries_created ON webhook_deliveries (created_at);
