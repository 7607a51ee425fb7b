-- Adopted settlements (issue 26): a transaction of one of our signer keys found on chain that
-- the ledger lacks (a failover to an asynchronous standby or a restore from a backup lost the
-- commits that recorded it) is recorded when found, mined, with the time it was adopted, so that
-- an operator can tell the rows the ledger rebuilt from the chain from the ones it wrote before
-- the broadcast. A nullable column without a default: added without rewriting the table.
ALTER TABLE settlements ADD COLUMN IF NOT EXISTS adopted_at timestamptz;
