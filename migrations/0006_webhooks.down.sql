DROP TABLE webhook_deliveries;
DROP TABLE webhooks;
DROP INDEX settlement_events_xid;
ALTER TABLE settlement_events DROP COLUMN xid;
