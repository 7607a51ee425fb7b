ALTER TABLE settlements DROP COLUMN success_claim;
