DROP INDEX settlements_updated;
ALTER TABLE settlements DROP CONSTRAINT settlements_state_check;
ALTER TABLE settlements ADD CONSTRAINT settlements_state_check CHECK (state IN
    ('signed', 'broadcast', 'mined', 'final', 'reverted', 'expired', 'settled_elsewhere'));
