"""Helpers for the course "Saving and logging from one rank only".

Importing this package changes nothing: no seeding, no plotting style, no process started.
Import the module you need, e.g. ``from helpers.spawn import run``.
"""

__version__ = "1.0.0"
