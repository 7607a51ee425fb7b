-- migrate: no transaction
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_webhook_due;
