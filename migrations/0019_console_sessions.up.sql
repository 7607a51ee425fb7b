-- Console sessions: a login through the console's form keeps a random token in the browser's
-- cookie; only its SHA-256 is stored, with the key that logged in and the scopes it had then.
-- A new table: nothing serving reads or writes it yet, so no lock here holds anything up.
CREATE TABLE console_sessions (
    token_hash bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    key_id     text NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    scopes     text[] NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz
);
-- Revoking a key ends its sessions; the retention job deletes sessions past their expiry.
CREATE INDEX console_sessions_key ON console_sessions (key_id);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);
