-- The settlement ledger. One row per EIP-3009 authorization, written (with the signed raw
-- transaction) before anything is broadcast: no row, no broadcast (DESIGN invariant 2).
CREATE TABLE settlements (
    id            bigserial PRIMARY KEY,
    network       text NOT NULL REFERENCES networks (id),
    asset         bytea NOT NULL CHECK (length(asset) = 20),
    payer         bytea NOT NULL CHECK (length(payer) = 20),
    auth_nonce    bytea NOT NULL CHECK (length(auth_nonce) = 32),
    pay_to        bytea NOT NULL CHECK (length(pay_to) = 20),
    value         numeric(78, 0) NOT NULL,
    valid_after   numeric(78, 0) NOT NULL,
    valid_before  numeric(78, 0) NOT NULL,
    x402_version  smallint NOT NULL,
    request       bytea NOT NULL,           -- the request body as received (bytes: it may hold anything JSON allows)
    fingerprint   bytea NOT NULL CHECK (length(fingerprint) = 32),  -- facilitator.Fingerprint
    signer        bytea NOT NULL CHECK (length(signer) = 20),
    tx_nonce      bigint NOT NULL CHECK (tx_nonce >= 0),
    state         text NOT NULL CHECK (state IN
                  ('signed', 'broadcast', 'mined', 'final', 'reverted', 'expired', 'settled_elsewhere')),
    tx_hash       bytea CHECK (length(tx_hash) = 32),  -- the variant that was mined, once known
    block_number  bigint,
    block_hash    bytea CHECK (length(block_hash) = 32),
    error_reason  text,
    error_message text,
    -- When a caller was answered success: true. Exactly one caller gets that answer (invariant 4).
    success_delivered_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- Invariant 1: one settlement per authorization. EIP-3009 nonces are unique per authorizer.
    UNIQUE (network, asset, payer, auth_nonce),
    -- Invariant 7: a signer's transaction nonce belongs to one settlement.
    UNIQUE (network, signer, tx_nonce)
);

-- Rows the engine still owes an outcome, found at start-up and by the watcher.
CREATE INDEX settlements_open ON settlements (network, signer, tx_nonce)
    WHERE state IN ('signed', 'broadcast', 'mined');

-- Every signed transaction of a settlement: the first and its fee-bumped replacements, which share
-- the settlement's tx nonce and are all watched.
CREATE TABLE settlement_txs (
    tx_hash       bytea PRIMARY KEY CHECK (length(tx_hash) = 32),
    settlement_id bigint NOT NULL REFERENCES settlements (id),
    raw           bytea NOT NULL,
    gas_tip_cap   numeric(78, 0) NOT NULL,
    gas_fee_cap   numeric(78, 0) NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX settlement_txs_settlement ON settlement_txs (settlement_id);

-- Each state transition with its time; nothing is deleted.
CREATE TABLE settlement_events (
    id            bigserial PRIMARY KEY,
    settlement_id bigint NOT NULL REFERENCES settlements (id),
    state         text NOT NULL,
    detail        text,
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX settlement_events_settlement ON settlement_events (settlement_id);
