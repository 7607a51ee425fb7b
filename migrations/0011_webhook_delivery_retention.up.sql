-- The retention job deletes finished deliveries (delivered or given up) past their retention; this
-- finds them without reading the whole table.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries ((COALESCE(delivered_at, gave_up_at)))
    WHERE next_attempt_at IS NULL;
