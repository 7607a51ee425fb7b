DROP TABLE networks;
