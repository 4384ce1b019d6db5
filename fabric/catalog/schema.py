"""Catalog schema: the only mutable state of a hub (refs, staging, indexes).

Every statement is ``CREATE ... IF NOT EXISTS`` and runs each time a catalog is
opened: a table added in a later version appears in an existing catalog then.
"""

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS repos (
    name TEXT PRIMARY KEY,
    default_branch TEXT NOT NULL,
    created {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS refs (
    repo TEXT NOT NULL,
    kind TEXT NOT NULL,
    name {text_c} NOT NULL,
    commit_id TEXT NOT NULL,
    staging_seq BIGINT NOT NULL DEFAULT 0,
    updated {real} NOT NULL,
    PRIMARY KEY (repo, kind, name)
);
CREATE TABLE IF NOT EXISTS commits (
    repo TEXT NOT NULL,
    id TEXT NOT NULL,
    PRIMARY KEY (repo, id)
);
CREATE TABLE IF NOT EXISTS staging (
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    path {text_c} NOT NULL,
    entry {blob},
    seq BIGINT NOT NULL,
    PRIMARY KEY (repo, branch, path)
);
CREATE TABLE IF NOT EXISTS packs (
    id TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    data_size BIGINT NOT NULL,
    created {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    id {blob} PRIMARY KEY,
    pack TEXT NOT NULL,
    off BIGINT NOT NULL,
    len INTEGER NOT NULL,
    raw_len INTEGER NOT NULL,
    touched {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_pack ON chunks (pack);
CREATE TABLE IF NOT EXISTS ref_events (
    seq {serial},
    repo TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    old_commit TEXT,
    new_commit TEXT,
    time {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS ref_events_by_time ON ref_events (time);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    name TEXT NOT NULL,
    admin INTEGER NOT NULL,
    created {real} NOT NULL,
    revoked {real}
);
CREATE TABLE IF NOT EXISTS token_roles (
    token_id TEXT NOT NULL,
    repo TEXT NOT NULL,
    role TEXT NOT NULL,
    PRIMARY KEY (token_id, repo)
)
"""

# S3 bucket bindings (issue 6): a bucket name bound to one branch or tag of a repository.
SCHEMA += """;
CREATE TABLE IF NOT EXISTS buckets (
    name TEXT PRIMARY KEY,
    repo TEXT NOT NULL,
    ref TEXT NOT NULL,
    created_by_s3 INTEGER NOT NULL DEFAULT 0,
    created {real} NOT NULL
)
"""

# Rights a token holds beyond its roles (issue 11): 'create-repos', 'spoke'.
SCHEMA += """;
CREATE TABLE IF NOT EXISTS token_rights (
    token_id TEXT NOT NULL,
    right_name TEXT NOT NULL,
    PRIMARY KEY (token_id, right_name)
)
"""

# Which repositories each chunk belongs to (issue 11): a chunk is stored once, but a
# repository may use (and its readers fetch) only the chunks recorded for it.
SCHEMA += """;
CREATE TABLE IF NOT EXISTS repo_chunks (
    repo TEXT NOT NULL,
    chunk {blob} NOT NULL,
    PRIMARY KEY (repo, chunk)
);
CREATE INDEX IF NOT EXISTS repo_chunks_by_chunk ON repo_chunks (chunk)
"""

# Spoke groups (issue 15): the live members of each group, by their last heartbeat.
SCHEMA += """;
CREATE TABLE IF NOT EXISTS group_members (
    group_name TEXT NOT NULL,
    url TEXT NOT NULL,
    token_id TEXT,
    seen {real} NOT NULL,
    PRIMARY KEY (group_name, url)
)
"""

# S3 bucket locations (issue 15): the LocationConstraint a bucket was created with, so every
# hub process answers GetBucketLocation alike (fabric.catalog.locations). `created` is the
# bucket binding's, so a bucket re-created another way does not inherit a location.
SCHEMA += """;
CREATE TABLE IF NOT EXISTS bucket_locations (
    name TEXT PRIMARY KEY,
    created {real} NOT NULL,
    location TEXT NOT NULL
)
"""

# S3 multipart uploads (issue 15): in the catalog, so every hub process serves every upload.
# A spoke's gateway keeps the same tables in a SQLite file of its own (fabric.catalog.uploads).
UPLOADS_SCHEMA = """
CREATE TABLE IF NOT EXISTS s3_uploads (
    id {text_c} PRIMARY KEY,
    bucket TEXT NOT NULL,
    key {text_c} NOT NULL,
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    path TEXT NOT NULL,
    meta TEXT NOT NULL,
    initiator TEXT NOT NULL,
    created {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS s3_uploads_by_key ON s3_uploads (bucket, key, id);
CREATE TABLE IF NOT EXISTS s3_parts (
    upload_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    etag TEXT NOT NULL,
    size BIGINT NOT NULL,
    chunks {blob} NOT NULL,
    modified {real} NOT NULL,
    PRIMARY KEY (upload_id, number)
);
CREATE TABLE IF NOT EXISTS s3_completed (
    id TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    path TEXT NOT NULL,
    etag TEXT NOT NULL,
    mtime_ns BIGINT NOT NULL,
    done {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS s3_completed_by_time ON s3_completed (done)
"""
SCHEMA += ";" + UPLOADS_SCHEMA
