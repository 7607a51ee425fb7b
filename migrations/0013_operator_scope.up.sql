-- The operator scope: the operations overview, and every merchant's settlements and webhooks (a
-- merchant key sees only its own).
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0
    AND scopes <@ ARRAY['verify', 'settle', 'status', 'webhooks', 'operator']::text[]);
