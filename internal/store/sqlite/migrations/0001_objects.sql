-- One table holds every stored object (see internal/store/doc.go).
CREATE TABLE objects (
    id               TEXT PRIMARY KEY,
    object_type      TEXT NOT NULL,
    workspace        TEXT NOT NULL DEFAULT '',
    name             TEXT,
    scope            TEXT,
    version          INTEGER,
    status           TEXT,
    dedup_key        TEXT,
    hit_count        INTEGER NOT NULL DEFAULT 0,
    labels           TEXT NOT NULL DEFAULT '{}',
    resource_version INTEGER NOT NULL DEFAULT 1,
    payload          BLOB NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    updated_at_ms    INTEGER NOT NULL
);
CREATE UNIQUE INDEX objects_name_uq ON objects (object_type, workspace, name) WHERE name IS NOT NULL;
CREATE UNIQUE INDEX objects_version_uq ON objects (object_type, scope, version) WHERE scope IS NOT NULL AND version IS NOT NULL;
CREATE INDEX objects_scope_status_idx ON objects (object_type, scope, status, version);
CREATE UNIQUE INDEX objects_dedup_uq ON objects (object_type, scope, dedup_key);
CREATE INDEX objects_list_idx ON objects (object_type, workspace, created_at_ms);
