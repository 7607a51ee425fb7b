-- Change notifications: merchants' webhooks, and the deliveries owed to them, fed from
-- settlement_events (the outbox: every state transition of a settlement is a row there).

-- settlement_events ids come from a sequence, and concurrent writers commit out of id order: a
-- reader that moved a cursor past the highest id it could see would skip a lower id committed a
-- moment later, and that event would never be delivered. The id of the writing transaction orders
-- them safely: every event whose xid is below the current snapshot's xmin is committed (or never
-- will be), so a cursor on (xid, id) that only reads below xmin never skips one. Rows written
-- before this migration keep NULL: no webhook existed to receive them. SET DEFAULT after ADD
-- COLUMN fills nothing in, so the table is not rewritten.
ALTER TABLE settlement_events ADD COLUMN xid xid8;
ALTER TABLE settlement_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX settlement_events_xid ON settlement_events (xid, id);

CREATE TABLE webhooks (
    id              text PRIMARY KEY CHECK (id ~ '^wh_[0-9a-f]{32}$'),
    url             text NOT NULL CHECK (length(url) <= 2048),
    -- The HMAC key, exactly as shown to the merchant once at registration. Signing needs it in
    -- clear, so it is stored as is: encrypt it at rest (a KMS-wrapped key) once merchant API keys
    -- and a key service exist.
    secret          text NOT NULL,
    -- Only settlements paying one of these addresses; empty: every settlement.
    pay_to          bytea[] NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    disabled_at     timestamptz,
    -- Every event at or before (cursor_xid, cursor_event_id) has been considered for this webhook.
    -- A new webhook starts at the registration's snapshot: it hears what happens from then on.
    cursor_xid      xid8 NOT NULL,
    cursor_event_id bigint NOT NULL DEFAULT 0
);

-- One row per (webhook, event) owed: created with the cursor's advance, in one statement, so an
-- event is either considered and owed, or not yet considered.
CREATE TABLE webhook_deliveries (
    webhook_id      text NOT NULL REFERENCES webhooks (id),
    event_id        bigint NOT NULL REFERENCES settlement_events (id),
    -- Attempts started; counted when an attempt is claimed, so a crash mid-send still counts it.
    attempts        integer NOT NULL DEFAULT 0,
    -- When the next attempt is due; while an attempt is in flight, when its claim lapses (so a
    -- replica that died mid-send is retried by another). NULL once delivered or given up.
    next_attempt_at timestamptz,
    delivered_at    timestamptz,
    gave_up_at      timestamptz,
    last_status     integer,  -- the receiver's HTTP status on the last attempt; NULL: no answer
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
