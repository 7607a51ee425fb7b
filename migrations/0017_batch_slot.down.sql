-- Fails while batched settlements are in the ledger (their members share a tx nonce).
ALTER TABLE settlements DROP CONSTRAINT settlements_network_signer_tx_nonce_key;
ALTER TABLE settlements ADD CONSTRAINT settlements_network_signer_tx_nonce_key UNIQUE (network, signer, tx_nonce);
ALTER TABLE settlements DROP COLUMN batch_slot;
