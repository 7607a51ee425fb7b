DROP INDEX webhook_deliveries_created;
DROP INDEX settlements_created;
DROP TABLE reconcile_runs;
