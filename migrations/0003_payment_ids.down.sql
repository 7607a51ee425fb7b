DROP TABLE payment_ids;
