ALTER TABLE api_keys DROP COLUMN gas_budget_wei;
DROP INDEX settlements_api_key_created;
DROP INDEX settlements_payer_created;
ALTER TABLE settlements DROP COLUMN gas_reserved;
ALTER TABLE settlements DROP COLUMN api_key;
