-- migrate: no transaction
-- Batched settlement (issue 16): several settlements share ONE transaction (a Multicall3
-- aggregate3 call) at one tx nonce of the signer, each in its own slot. The transaction and its
-- fee-bumped variants are recorded under slot 0; the other members find them by (network, signer,
-- tx_nonce). Invariant 7 holds on the slot: a lone settlement is slot 0, so a lone settlement and
-- a batch at one nonce collide on slot 0, and so do two batches.
--
-- Written so that replicas keep serving while it runs on a big ledger: the column's constant
-- default is set without rewriting the table, its check is validated after it is added (VALIDATE
-- takes a lock that blocks no read or write), and the new unique index is built CONCURRENTLY,
-- then swapped in for the old constraint in one short ALTER. Every statement can run again after
-- a failure part of the way (the migrator runs the file from its start).
ALTER TABLE settlements ADD COLUMN IF NOT EXISTS batch_slot smallint NOT NULL DEFAULT 0;
ALTER TABLE settlements DROP CONSTRAINT IF EXISTS settlements_batch_slot_check,
    ADD CONSTRAINT settlements_batch_slot_check CHECK (batch_slot >= 0 AND batch_slot < 100) NOT VALID;
ALTER TABLE settlements VALIDATE CONSTRAINT settlements_batch_slot_check;
DROP INDEX CONCURRENTLY IF EXISTS settlements_network_signer_tx_nonce_slot;
CREATE UNIQUE INDEX CONCURRENTLY settlements_network_signer_tx_nonce_slot ON settlements (network, signer, tx_nonce, batch_slot);
ALTER TABLE settlements DROP CONSTRAINT settlements_network_signer_tx_nonce_key,
    ADD CONSTRAINT settlements_network_signer_tx_nonce_key UNIQUE USING INDEX settlements_network_signer_tx_nonce_slot;
