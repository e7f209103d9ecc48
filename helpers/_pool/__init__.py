"""Internals of :mod:`helpers.spawn` (the gloo worker pool). Not a public API.

``messages``  what a rank sends back to the caller, framed as JSON + raw bytes (never pickle)
"""
