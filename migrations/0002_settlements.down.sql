DROP TABLE settlement_events;
DROP TABLE settlement_txs;
DROP TABLE settlements;
