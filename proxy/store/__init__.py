"""Where originals, checkpoints and accounting live: Redis for deployments, SQLite embedded."""
