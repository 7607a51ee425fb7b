ALTER TABLE settlements DROP COLUMN IF EXISTS adopted_at;
