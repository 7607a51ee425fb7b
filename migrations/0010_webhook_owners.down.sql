ALTER TABLE webhooks DROP COLUMN api_key;
