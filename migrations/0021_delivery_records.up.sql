-- What the merchant delivered for a settled payment (issue 27): the SHA-256 of the response it
-- served, and optionally its content type and size, attached once by the API key that made the
-- settlement (key_id; NULL when attached in open mode) and shown on the authorization's status.
-- One per settlement, never replaced. A new table: nothing serving reads or writes it yet; the
-- reference to settlements takes a brief lock there (no scan: the table is empty).
CREATE TABLE delivery_records (
    settlement_id bigint PRIMARY KEY REFERENCES settlements (id),
    sha256        bytea NOT NULL CHECK (length(sha256) = 32),
    content_type  text CHECK (length(content_type) BETWEEN 1 AND 255),
    size          bigint CHECK (size >= 0),
    key_id        text,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
