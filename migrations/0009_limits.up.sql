-- Limits and guards (issue #8): per-wallet caps and per-key gas budgets are counted from the
-- ledger itself, inside the statement that writes a settlement, so they hold across replicas.

-- The merchant API key a settlement was requested with (NULL in open mode, and for rows written
-- before this migration). No foreign key: keys are never deleted, and the ledger must not depend
-- on the key store to record what was signed.
ALTER TABLE settlements ADD COLUMN api_key text;
-- The worst-case gas cost of the settlement's transaction family, in wei: gas limit times max
-- fee per gas of its most expensive variant (raised on a fee bump). NULL for older rows.
ALTER TABLE settlements ADD COLUMN gas_reserved numeric(78, 0);

-- A wallet's recent settlements (the wallet cap's window) and a key's (the gas budget's day).
CREATE INDEX settlements_payer_created ON settlements (network, asset, payer, created_at);
CREATE INDEX settlements_api_key_created ON settlements (api_key, created_at) WHERE api_key IS NOT NULL;

-- A key's gas budget per rolling 24 hours, in wei. NULL: the server's default
-- (--key-gas-budget-wei); 0: unlimited.
ALTER TABLE api_keys ADD COLUMN gas_budget_wei numeric(78, 0) CHECK (gas_budget_wei >= 0);
