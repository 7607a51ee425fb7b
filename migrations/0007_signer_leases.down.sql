DROP TABLE signer_leases;
