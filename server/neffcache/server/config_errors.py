"""Configuration errors, raised at start-up: each message names the fix."""

from __future__ import annotations


class ConfigError(Exception):
    """The settings cannot work as given."""
