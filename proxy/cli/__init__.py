"""The `compactd` command: serve (its workers and listening sockets), check-config, compress, and
the inspection commands. The top layer: it may import every other one.
"""
