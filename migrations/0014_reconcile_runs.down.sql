DROP INDEX webhook_deliveries_created;
DROP TABLE reconcile_runs;
