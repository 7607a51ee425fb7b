-- Key rotation (`facilitator keys rotate`): a key's new secret replaces key_hash under the same
-- id, and the hash of the secret it replaced is accepted until previous_until (the grace, so that
-- a merchant can deploy the new secret before the old one stops). rotated_at: the latest rotation.
-- Columns without a default: nothing is rewritten, and a release that does not know them reads
-- its own columns as before (it refuses a rotated key's old secret, which only shortens the grace).
ALTER TABLE api_keys ADD COLUMN previous_hash bytea, ADD COLUMN previous_until timestamptz,
    ADD COLUMN rotated_at timestamptz;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_previous_hash_check
    CHECK (previous_hash IS NULL OR length(previous_hash) = 32) NOT VALID;
ALTER TABLE api_keys VALIDATE CONSTRAINT api_keys_previous_hash_check;
