"""The dashboard's files, loaded once from the package and kept in memory.

The page names its assets ``/assets/NAME``; on loading, each such reference gets
``?v=`` and a digest of the asset's bytes, so a browser may keep an asset for a year
and still fetches the new one after an upgrade (a new page names a new digest). The
reason codes' meanings go into the page as a JSON data block (not a script: the
Content-Security-Policy runs only the server's own files), so the page and the
server never disagree about them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from neffcache.server.explain.reasons import REASONS

CONTENT_TYPES: Mapping[str, str] = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# What an asset may be called: one plain file name, so no request can name anything else.
ASSET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\.(?:js|css|svg)")
_REFERENCE = re.compile(r'"/assets/([^"?]+)"')
_REASONS_SLOT = "{{reasons}}"


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    version: str  # the first 16 hex digits of the body's SHA-256

    @property
    def etag(self) -> str:
        return f'"{self.version}"'


@dataclass(frozen=True)
class Dashboard:
    page: bytes
    assets: Mapping[str, Asset]


@functools.cache
def load() -> Dashboard:
    """The page and its assets (read once per process; they change only with the package)."""
    root = resources.files(__package__)
    assets: dict[str, Asset] = {}
    for item in root.iterdir():
        if item.is_file() and ASSET_NAME.fullmatch(item.name):
            body = item.read_bytes()
            suffix = item.name[item.name.rindex(".") :]
            version = hashlib.sha256(body).hexdigest()[:16]
            assets[item.name] = Asset(body, CONTENT_TYPES[suffix], version)
    page = root.joinpath("index.html").read_text(encoding="utf-8")
    return Dashboard(render_page(page, assets).encode(), assets)


def render_page(page: str, assets: Mapping[str, Asset]) -> str:
    """``page`` with versioned asset URLs and the reason codes filled in; a reference to
    an asset that does not exist is a packaging mistake, raised at once."""

    def versioned(found: re.Match[str]) -> str:
        name = found[1]
        if name not in assets:
            raise LookupError(f"the dashboard page names a missing asset: {name}")
        return f'"/assets/{name}?v={assets[name].version}"'

    reasons = json.dumps(dict(REASONS), sort_keys=True)
    # "<" escaped, so no value could close the data block early.
    reasons = reasons.replace("<", "\\u003c")
    return _REFERENCE.sub(versioned, page).replace(_REASONS_SLOT, reasons)
