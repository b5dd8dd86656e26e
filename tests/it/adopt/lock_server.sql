-- A lock server's own migration, as its migration tool would apply it as
-- the lock server's owner role: its tables with columns of its own (one NOT
-- NULL without a default), its own token sequence, its own trigger and its
-- own history table. Nothing here knows the sidecar.
CREATE TABLE flyway_schema_history (
    installed_rank integer PRIMARY KEY,
    version        text,
    description    text NOT NULL,
    script         text NOT NULL,
    checksum       integer,
    installed_on   timestamp NOT NULL DEFAULT now(),
    success        boolean NOT NULL
);
INSERT INTO flyway_schema_history (installed_rank, version, description, script, checksum, success)
VALUES (1, '1', 'lockdb', 'V1__lockdb.sql', 1244557, true),
       (2, '2', 'lease audit', 'V2__lease_audit.sql', -8812, true);

CREATE TABLE lock_session (
    session_id   uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    client_name  text        NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE ls_fencing_seq AS bigint START 1000;

CREATE TABLE lock_entry (
    lock_key      varchar(200) PRIMARY KEY,
    owner_id      text         NOT NULL,
    token         bigint       NOT NULL,
    session_id    uuid         REFERENCES lock_session ON DELETE CASCADE,
    acquired_at   timestamptz  NOT NULL,
    expires_at    timestamptz  NOT NULL,
    lease_version integer      NOT NULL,
    holder_host   text
);
CREATE INDEX lock_entry_expiry_idx ON lock_entry (expires_at);

-- Its own trigger: every grant is audited.
CREATE TABLE lock_grant_audit (
    lock_key text NOT NULL,
    token    bigint NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE FUNCTION lock_entry_audit_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO lock_grant_audit (lock_key, token) VALUES (NEW.lock_key, NEW.token);
    RETURN NEW;
END $$;
CREATE TRIGGER lock_entry_audit_grant
    AFTER INSERT OR UPDATE OF token ON lock_entry
    FOR EACH ROW EXECUTE FUNCTION lock_entry_audit_grant();
