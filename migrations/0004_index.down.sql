DROP TABLE authorization_events;
DROP TABLE transfers;
DROP TABLE index_blocks;
DROP TABLE index_cursors;
