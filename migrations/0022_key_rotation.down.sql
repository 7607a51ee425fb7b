ALTER TABLE api_keys DROP COLUMN previous_hash, DROP COLUMN previous_until, DROP COLUMN rotated_at;
