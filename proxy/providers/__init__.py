"""Compression providers: the plugin API, the registry and the built-ins."""
