-- Which claim of a settlement's success is the one recorded: a claim whose commit answered an error
-- may have committed, and only that claim (not a later caller's) may be released.
ALTER TABLE settlements ADD COLUMN success_claim bytea;
