-- The merchant's lists (GET /v1/settlements, the console): newest first, a page at a time, keyed
-- on (created_at, id) so a page's next one starts exactly after its last row. Each index serves
-- one kind of list, read backwards: everyone's (an operator key, open mode), one key's, one
-- payer's. The key's index replaces 0009's (api_key, created_at), which it covers for the gas
-- budget's 24-hour sum as well.
CREATE INDEX settlements_list ON settlements (created_at, id);
CREATE INDEX settlements_api_key_list ON settlements (api_key, created_at, id) WHERE api_key IS NOT NULL;
DROP INDEX settlements_api_key_created;
CREATE INDEX settlements_payer_list ON settlements (payer, created_at, id);
