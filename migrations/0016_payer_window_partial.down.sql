DROP INDEX settlements_payer_created;
CREATE INDEX settlements_payer_created ON settlements (network, asset, payer, created_at);
