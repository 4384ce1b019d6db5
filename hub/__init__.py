"""The hub service: the authoritative store (engine, tokens, watch stream) behind REST and S3."""
