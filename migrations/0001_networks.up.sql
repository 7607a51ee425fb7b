-- Which chain this database's ledger belongs to. A ledger written against one chain and read
-- against another (an RPC URL pointed at the wrong network, a dev chain restarted from genesis)
-- would answer status questions with confident nonsense, so serve refuses to start when the
-- configured network's chain id or genesis hash differs from what is recorded here.
CREATE TABLE networks (
    id           text PRIMARY KEY,             -- CAIP-2, e.g. eip155:84532
    chain_id     numeric(20, 0) NOT NULL,
    genesis_hash bytea NOT NULL CHECK (length(genesis_hash) = 32),
    bound_at     timestamptz NOT NULL DEFAULT now()
);
