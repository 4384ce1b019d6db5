"""The spoke service: a data plane that caches a hub next to the GPUs (fetch, coherence, write-back)."""
