-- One table holds every stored object (see internal/store/doc.go).
CREATE TABLE objects (
    id               TEXT PRIMARY KEY,
    object_type      TEXT NOT NULL,
    workspace        TEXT NOT NULL DEFAULT '',
    name             TEXT,
    scope            TEXT,
    version          BIGINT,
    status           TEXT,
    dedup_key        TEXT,
    hit_count        BIGINT NOT NULL DEFAULT 0,
    labels           JSONB NOT NULL DEFAULT '{}'::jsonb,
    resource_version BIGINT NOT NULL DEFAULT 1,
    payload          BYTEA NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    updated_at_ms    BIGINT NOT NULL
);
CREATE UNIQUE INDEX objects_name_uq ON objects (object_type, workspace, name) WHERE name IS NOT NULL;
CREATE UNIQUE INDEX objects_version_uq ON objects (object_type, scope, version) WHERE scope IS NOT NULL AND version IS NOT NULL;
CREATE INDEX objects_scope_status_idx ON objects (object_type, scope, status, version);
CREATE UNIQUE INDEX objects_dedup_uq ON objects (object_type, scope, dedup_key);
CREATE INDEX objects_list_idx ON objects (object_type, workspace, created_at_ms);
CREATE INDEX objects_labels_gin ON objects USING GIN (labels jsonb_path_ops);
