-- A success claim counts once its answer was written: until ConfirmDeliveries clears it, the
-- claim holds the success only until success_lease_until, and a claim whose process died before
-- its answer went out is taken over by the next identical request after that. NULL: no claim, or
-- a confirmed one (every claim made before this migration).
ALTER TABLE settlements ADD COLUMN success_lease_until timestamptz;
-- How many times a claim was taken over from one whose lease ended unconfirmed: an upper bound on
-- the successes answered twice (the dead claim's answer may have been written just before its
-- process died, its confirmation not).
ALTER TABLE settlements ADD COLUMN success_takeovers integer NOT NULL DEFAULT 0;
