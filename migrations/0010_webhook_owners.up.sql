-- Webhooks belong to the merchant API key that registered them: only that key lists and deletes
-- them, and the registration limit is counted per key. NULL: registered in open mode (local
-- development), as every row written before this migration was; those are listed and deleted
-- only without a key. No foreign key, like settlements.api_key: keys are never deleted.
ALTER TABLE webhooks ADD COLUMN api_key text;
