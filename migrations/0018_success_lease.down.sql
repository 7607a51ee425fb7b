ALTER TABLE settlements DROP COLUMN success_takeovers;
ALTER TABLE settlements DROP COLUMN success_lease_until;
