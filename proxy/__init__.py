"""compactd: a transparent, OpenAI-compatible proxy that compacts chat requests reversibly."""

__version__ = "0.1.0"
