-- An authorization can also be canceled on chain by its authorizer (cancelAuthorization) before we
-- settle it: a settlement of it can then never land. The reconcile job records that.
ALTER TABLE settlements DROP CONSTRAINT settlements_state_check;
ALTER TABLE settlements ADD CONSTRAINT settlements_state_check CHECK (state IN
    ('signed', 'broadcast', 'mined', 'final', 'reverted', 'expired', 'settled_elsewhere', 'canceled'));
CREATE INDEX settlements_updated ON settlements (updated_at) WHERE state IN ('signed', 'broadcast', 'mined');
