"""The embedded store: SQLite in WAL mode, shared by the worker processes of one machine."""
