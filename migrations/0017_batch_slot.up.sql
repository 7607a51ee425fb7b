-- Batched settlement (issue 16): several settlements share ONE transaction (a Multicall3
-- aggregate3 call) at one tx nonce of the signer, each in its own slot. The transaction and its
-- fee-bumped variants are recorded under slot 0; the other members find them by (network, signer,
-- tx_nonce). Invariant 7 holds on the slot: a lone settlement is slot 0, so a lone settlement and
-- a batch at one nonce collide on slot 0, and so do two batches.
ALTER TABLE settlements ADD COLUMN batch_slot smallint NOT NULL DEFAULT 0 CHECK (batch_slot >= 0 AND batch_slot < 100);
ALTER TABLE settlements DROP CONSTRAINT settlements_network_signer_tx_nonce_key;
ALTER TABLE settlements ADD CONSTRAINT settlements_network_signer_tx_nonce_key UNIQUE (network, signer, tx_nonce, batch_slot);
