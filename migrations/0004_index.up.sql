-- The block index: Transfer, AuthorizationUsed and AuthorizationCanceled logs of every configured
-- token, so that any outcome can be resolved by reading indexed state instead of settling again
-- (DESIGN invariant 6).

-- How far each network is indexed: every log up to and including block `number` is stored.
CREATE TABLE index_cursors (
    network    text PRIMARY KEY REFERENCES networks (id),
    number     bigint NOT NULL,
    hash       bytea CHECK (length(hash) = 32),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Blocks inside the unfinalized window, to detect reorgs by parent hash. Older rows are pruned.
CREATE TABLE index_blocks (
    network     text NOT NULL REFERENCES networks (id),
    number      bigint NOT NULL,
    hash        bytea NOT NULL CHECK (length(hash) = 32),
    parent_hash bytea NOT NULL CHECK (length(parent_hash) = 32),
    PRIMARY KEY (network, number)
);

CREATE TABLE transfers (
    network      text NOT NULL,
    block_number bigint NOT NULL,
    block_hash   bytea NOT NULL,
    block_time   timestamptz,              -- from the log's blockTimestamp, where the node gives it
    tx_hash      bytea NOT NULL,
    log_index    integer NOT NULL,
    token        bytea NOT NULL,
    from_addr    bytea NOT NULL,
    to_addr      bytea NOT NULL,
    value        numeric(78, 0) NOT NULL,
    PRIMARY KEY (network, tx_hash, log_index)
);
CREATE INDEX transfers_tx ON transfers (network, tx_hash);
CREATE INDEX transfers_from ON transfers (network, from_addr, block_number);
CREATE INDEX transfers_to ON transfers (network, to_addr, block_number);
CREATE INDEX transfers_from_time ON transfers (network, from_addr, block_time);
CREATE INDEX transfers_to_time ON transfers (network, to_addr, block_time);
CREATE INDEX transfers_block ON transfers (network, block_number);

-- AuthorizationUsed (kind 'used') and AuthorizationCanceled (kind 'canceled').
CREATE TABLE authorization_events (
    network      text NOT NULL,
    block_number bigint NOT NULL,
    block_hash   bytea NOT NULL,
    block_time   timestamptz,
    tx_hash      bytea NOT NULL,
    log_index    integer NOT NULL,
    token        bytea NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('used', 'canceled')),
    authorizer   bytea NOT NULL,
    nonce        bytea NOT NULL,
    PRIMARY KEY (network, tx_hash, log_index)
);
CREATE INDEX authorization_events_nonce ON authorization_events (network, token, authorizer, nonce);
CREATE INDEX authorization_events_tx ON authorization_events (network, tx_hash);
CREATE INDEX authorization_events_block ON authorization_events (network, block_number);
