"""Configuration errors, raised at start-up (each message names the fix), and the
scheme registry that opens backends from URLs."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


class ConfigError(Exception):
    """The settings cannot work as given."""


def open_by_scheme(url: str, what: str, registry: Mapping[str, tuple[str, str, str]]) -> Any:
    """Open the backend a URL's scheme names: ``registry`` maps a scheme to (module,
    class, example URL); the class's ``from_url`` does the rest. An unknown scheme, or
    a module whose extra is not installed, is a ConfigError that says what to do."""
    usage = ", ".join(example for _, _, example in registry.values())
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError(f"{what} URL {url!r} has no scheme; use {usage}")
    if scheme not in registry:
        raise ConfigError(f"unknown {what} scheme {scheme!r}; use {usage}")
    module_name, class_name, _ = registry[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS.get(scheme)
        if extra is None:
            raise
        raise ConfigError(
            f"{scheme}:// {what}s need an extra: pip install 'neffcache[{extra}]' ({exc})"
        ) from exc
    return getattr(module, class_name).from_url(url)


# Schemes whose backend lives behind an optional dependency.
_EXTRAS = {"s3": "s3", "redis": "redis", "rediss": "redis"}
