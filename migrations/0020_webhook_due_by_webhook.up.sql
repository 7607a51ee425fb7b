-- migrate: no transaction
-- Fair shares of webhook delivery (issue 24): a claim takes each enabled webhook's own oldest due
-- deliveries, webhook by webhook, so that one owner's backlog (the oldest of all) cannot push
-- another's fresh delivery out of the claim. This index answers "the due deliveries of one
-- webhook, oldest first" without reading its finished ones, which the retention keeps for a month.
-- Built CONCURRENTLY, so replicas keep claiming and recording while it is built; the statement
-- can run again after a failure part of the way.
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_webhook_due;
CREATE INDEX CONCURRENTLY webhook_deliveries_webhook_due ON webhook_deliveries (webhook_id, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
