DROP INDEX settlements_payer_list;
CREATE INDEX settlements_api_key_created ON settlements (api_key, created_at) WHERE api_key IS NOT NULL;
DROP INDEX settlements_api_key_list;
DROP INDEX settlements_list;
