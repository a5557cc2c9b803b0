"""What the bridge tests (tests/bridge) share: a server they started (its URL and the
stores it serves, with reads through its API) and the CLI's outcome when run in this
process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from neffcache.server.blobs import BlobStore
from neffcache.server.index import Index


@dataclass
class Server:
    url: str
    blobs: BlobStore
    index: Index

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers, timeout=10, trust_env=False)

    def entries(self, namespace: str) -> list[dict[str, Any]]:
        """Every entry of a namespace, through the listing route, two per page."""
        found: list[dict[str, Any]] = []
        after = None
        while True:
            query = "?limit=2" + (f"&after={after}" if after else "")
            response = self.get(f"/v1/ns/{namespace}/entries{query}")
            assert response.status_code == 200, response.text
            found += response.json()["entries"]
            after = response.json()["next"]
            if after is None:
                return found

    def alias(self, namespace: str, alias: str) -> dict[str, Any] | None:
        response = self.get(f"/v1/ns/{namespace}/aliases/{alias}")
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found


StartServer = Callable[..., Server]


Run = Callable[..., tuple[int, str, str]]
