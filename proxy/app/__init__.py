"""The app and the admin side: the ASGI app and its lifespan, compactd's own API, the dashboard.

Below the CLI; above the chat pipeline and everything under it.
"""
