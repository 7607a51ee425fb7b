-- Who holds each signer key (DESIGN invariant 7: across replicas a key is leased, never shared).
-- The lease itself is a session advisory lock on a connection of its own, which Postgres drops with
-- the session (a dead or frozen process loses its keys); this table is what operators and the
-- replicas read about it. The holder writes its row through the lease session when it takes the
-- key and renews it every second; epoch counts the takings, so a change of holder is visible.
CREATE TABLE signer_leases (
    network     text NOT NULL,
    signer      bytea NOT NULL CHECK (length(signer) = 20),
    holder      text NOT NULL,            -- host and process id of the facilitator holding the key
    session_pid integer NOT NULL,         -- the lease session's backend (pg_stat_activity.pid)
    epoch       bigint NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,              -- set when the holder gave the key back cleanly
    PRIMARY KEY (network, signer)
);
