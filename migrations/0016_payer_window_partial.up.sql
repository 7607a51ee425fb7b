-- migrate: no transaction
-- The wallet cap's window index covers only the states a cap counts. Its full form, (network,
-- asset, payer, created_at) over every row, shares the authorization key's first three columns:
-- without fresh statistics (a young or just-filled ledger) the planner took it for the lookup by
-- authorization key, the first read of every /settle, and scanned the payer's whole history to
-- find one nonce (143 index entries per settlement in the profile's run, growing with each
-- payer's history). A partial index is usable only by queries whose WHERE implies its predicate,
-- and every wallet cap query states these states; the lookup by key does not, so it can only use
-- the unique index.
--
-- The new index is built CONCURRENTLY under a name of its own, then takes the old one's place
-- (writes to settlements go on meanwhile); every step can run again after a failure.
DROP INDEX CONCURRENTLY IF EXISTS settlements_payer_window;
CREATE INDEX CONCURRENTLY settlements_payer_window ON settlements (network, asset, payer, created_at)
    WHERE state IN ('signed', 'broadcast', 'mined', 'final');
DROP INDEX CONCURRENTLY IF EXISTS settlements_payer_created;
ALTER INDEX settlements_payer_window RENAME TO settlements_payer_created;
