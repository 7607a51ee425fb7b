-- payment-identifier ids (the x402 extension), bound to the request they first came with.
--
-- A row is written in the same statement as its settlement, so an id exists exactly when a
-- settlement does, and its state is always the settlement's: a process that dies mid-request
-- leaves no id stuck "in flight" (recovery resumes the settlement, and with it the id).
--
-- The full stored answer (response) is kept until response_expires_at; after that the retention
-- job clears it, and the id→settlement link stays for as long as the settlement row does, so a
-- retry weeks later still gets the outcome, rebuilt from the ledger.
CREATE TABLE payment_ids (
    -- '' until merchant API keys exist; then the key's id, so two merchants' ids never meet.
    -- Rows written before that keep scope '' and their links.
    scope               text NOT NULL DEFAULT '',
    id                  text NOT NULL CHECK (id ~ '^[A-Za-z0-9_-]{16,128}$'),
    fingerprint         bytea NOT NULL CHECK (length(fingerprint) = 32),
    settlement_id       bigint NOT NULL REFERENCES settlements (id),
    -- The request's canonical fields, to say what differs when the id comes back with another request.
    summary             jsonb NOT NULL,
    response            bytea,
    response_expires_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, id)
);
CREATE INDEX payment_ids_settlement ON payment_ids (settlement_id);
CREATE INDEX payment_ids_expiring ON payment_ids (response_expires_at) WHERE response IS NOT NULL;
