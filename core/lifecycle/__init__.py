"""Memory lifecycle: expiry of `daily` and `conversation` memories, run teardown, importance decay, the
per-agent entry cap, and the staleness watcher. The `prune` job (core.lifecycle.prune) runs them on beat."""
