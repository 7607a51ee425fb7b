UPDATE api_keys SET scopes = array_remove(scopes, 'operator');
DELETE FROM api_keys WHERE cardinality(scopes) = 0;
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0
    AND scopes <@ ARRAY['verify', 'settle', 'status', 'webhooks']::text[]);
