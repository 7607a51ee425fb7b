-- Merchant API keys. The key text (x402_<id>_<secret>) is shown once at creation and never
-- stored: only its SHA-256. id is the key's public name, and the scope of the payment-identifier
-- ids sent with it (payment_ids.scope).
CREATE TABLE api_keys (
    id         text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{12}$'),
    key_hash   bytea NOT NULL CHECK (length(key_hash) = 32),
    name       text NOT NULL,
    -- verify, settle, status, webhooks
    scopes     text[] NOT NULL CHECK (cardinality(scopes) > 0
                   AND scopes <@ ARRAY['verify', 'settle', 'status', 'webhooks']::text[]),
    -- payTo addresses (20 bytes each) the key may be used for; empty: any.
    pay_to     bytea[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
