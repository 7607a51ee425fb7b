-- migrate: no transaction
-- The merchant's lists (GET /v1/settlements, the console): newest first, a page at a time, keyed
-- on (created_at, id) so a page's next one starts exactly after its last row. Each index serves
-- one kind of list, read backwards: everyone's (an operator key, open mode), one key's, one
-- payer's. The key's index replaces 0009's (api_key, created_at), which it covers for the gas
-- budget's 24-hour sum as well.
--
-- Built CONCURRENTLY (statement by statement, outside a transaction): a plain CREATE INDEX holds
-- off every write to settlements, every /settle, while it reads the whole table. An index left
-- invalid by a build that failed is dropped and built again when the file runs again.
DROP INDEX CONCURRENTLY IF EXISTS settlements_list;
CREATE INDEX CONCURRENTLY settlements_list ON settlements (created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS settlements_api_key_list;
CREATE INDEX CONCURRENTLY settlements_api_key_list ON settlements (api_key, created_at, id) WHERE api_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS settlements_api_key_created;
DROP INDEX CONCURRENTLY IF EXISTS settlements_payer_list;
CREATE INDEX CONCURRENTLY settlements_payer_list ON settlements (payer, created_at, id);
