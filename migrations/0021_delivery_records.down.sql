DROP TABLE delivery_records;
