"""The server's HTTP API (docs/protocol.md) as the bridge uses it, over httpx.

Two kinds of trouble, as two exceptions:

* ``Unusable``: the run cannot go on (the server cannot be reached, or answers as no
  server of this version would). The command stops with one line (exit 1); as
  ``TokenRefused`` when it refuses the token (exit 2: bad input).
* ``Refused``: one request failed (a blob refused, a server error, a transfer cut
  short). Only the entry at hand fails; the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import blake3
import httpx

# The wire's patterns, from neffcache.protocol rather than server/manifest.py, so that
# the bridge needs httpx and not pydantic; re-exported for the exporter and importer.
from neffcache.protocol import FILE_NAME as FILE_NAME
from neffcache.protocol import HEX64 as HEX64
from neffcache.protocol import is_hex64

_CHUNK = 1 << 20
# The server's own limit on one POST /v1/blobs/missing.
_MISSING_MAX = 10_000
# Connecting is quick or never; a large blob on a slow link is neither.
_TIMEOUT = httpx.Timeout(120.0, connect=10.0)


class Unusable(Exception):
    """The server cannot be used at all; the message is one line."""


class TokenRefused(Unusable):
    """The server refuses the token (401, 403); the message is one line."""


class Refused(Exception):
    """One request failed; the message is one line."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Remote:
    """One namespace of one server.

    >>> remote = Remote("http://cache.internal:8787", "team-a", token=None)
    >>> remote.entry("ab" * 32) is None
    True
    """

    def __init__(
        self,
        server: str,
        namespace: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = server
        self.namespace = namespace
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=server, headers=headers, timeout=_TIMEOUT, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    # --- entries ----------------------------------------------------------------------

    def entry(self, key: str) -> dict[str, Any] | None:
        """The entry under ``key``, or None."""
        response = self._send("GET", f"/v1/ns/{self.namespace}/entries/{key}")
        if response.status_code == 404:
            return None
        found: dict[str, Any] = self._json(self._ok(response, f"entry {key}"))
        return found

    def put_entry(self, key: str, manifest: dict[str, Any]) -> int:
        """PUT a manifest: 201 created, 200 the same one was there, 409 a different one
        is; Refused otherwise (``body["missing"]`` names blobs the server lacks)."""
        response = self._send(
            "PUT", f"/v1/ns/{self.namespace}/entries/{key}", content=json.dumps(manifest)
        )
        if response.status_code not in (200, 201, 409):
            self._ok(response, f"entry {key}")  # raises for an error status
            raise Refused(f"entry {key}: unexpected HTTP {response.status_code}")
        return response.status_code

    def add_alias(self, alias: str, key: str) -> bool:
        """Make ``alias`` (a Neuron address or a direct key) name the entry ``key``:
        True when added now, False when it already named it or names another key.
        Refused otherwise; a server without the route is Unusable."""
        response = self._send("PUT", f"/v1/ns/{self.namespace}/aliases/{alias}", json={"key": key})
        if response.status_code == 405:
            raise Unusable(
                f"{self.server} cannot add aliases (HTTP 405); it may predate "
                "PUT /v1/ns/{ns}/aliases/{alias}: upgrade it"
            )
        if response.status_code == 409:
            return False
        self._ok(response, f"alias {alias}")
        return response.status_code == 201

    def aliases(self, key: str) -> list[str]:
        """Every alias naming the entry ``key`` (direct keys and Neuron addresses);
        ``[]`` when the entry is gone. A server without the route is Unusable."""
        response = self._send("GET", f"/v1/ns/{self.namespace}/entries/{key}/aliases")
        if response.status_code == 404 and _absent(response):
            return []
        if response.status_code in (404, 405):
            raise Unusable(
                f"{self.server} cannot list an entry's aliases (HTTP {response.status_code}); "
                "it may predate GET /v1/ns/{ns}/entries/{key}/aliases: upgrade it"
            )
        found = self._json(self._ok(response, f"the aliases of {key}"))
        names = found.get("aliases") if isinstance(found, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise Refused(f"{self.server} answered the aliases of {key} with something else")
        return names

    def pages(self, limit: int = 1000) -> Iterator[list[dict[str, Any]]]:
        """Every entry of the namespace, a page at a time, in key order. A server
        without the listing route, or whose answer is not a page that moves on, is
        Unusable."""
        after: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": limit}
            if after is not None:
                params["after"] = after
            response = self._send("GET", f"/v1/ns/{self.namespace}/entries", params=params)
            if response.status_code in (404, 405):
                raise Unusable(
                    f"{self.server} cannot list entries (HTTP {response.status_code}); "
                    "it may predate GET /v1/ns/{ns}/entries: upgrade it"
                )
            try:
                page = self._json(self._ok(response, "the entry listing"))
            except Refused as exc:
                raise Unusable(str(exc)) from None
            entries, after = self._checked_page(page, after)
            yield entries
            if after is None:
                return

    def _checked_page(
        self, page: Any, after: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page's entries and ``next``, when it has the listing's shape and ``next``
        moves past ``after`` (else a broken server would be asked forever)."""
        entries = page.get("entries") if isinstance(page, dict) else None
        following = page.get("next", "") if isinstance(page, dict) else ""
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise Unusable(f"{self.server} answered the entry listing with something else")
        if following is not None and not (
            isinstance(following, str)
            and is_hex64(following)
            and (after is None or following > after)
        ):
            raise Unusable(
                f"{self.server} answered the entry listing with a next key "
                f"{str(following)[:80]!r} that does not follow {after or 'the start'}"
            )
        return entries, following

    # --- blobs ------------------------------------------------------------------------

    def missing(self, digests: list[str]) -> list[str]:
        """The digests the server lacks."""
        lacking: list[str] = []
        for at in range(0, len(digests), _MISSING_MAX):
            chunk = digests[at : at + _MISSING_MAX]
            response = self._send("POST", "/v1/blobs/missing", json={"digests": chunk})
            lacking += self._json(self._ok(response, "the blob check"))["missing"]
        return lacking

    def put_blob(self, digest: str, file: BinaryIO, size: int) -> None:
        """Upload an open file, streamed; Refused if the server does not take it."""

        def chunks() -> Iterator[bytes]:
            while chunk := file.read(_CHUNK):
                yield chunk

        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        response = self._send("PUT", f"/v1/blobs/{digest}", content=chunks(), headers=headers)
        self._ok(response, f"blob {digest}")

    def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
        """Download a blob into ``dest``, checking its size and BLAKE3 digest; Refused
        when it is absent, short, longer (it stops at ``size``: a broken server must
        not fill the disk) or not what it should be (``dest`` may hold a part)."""
        hasher = blake3.blake3()
        received = 0
        try:
            with (
                self._http.stream("GET", f"/v1/blobs/{digest}") as response,
                dest.open("wb") as out,
            ):
                self._ok(response, f"blob {digest}")
                for chunk in response.iter_bytes(_CHUNK):
                    if received + len(chunk) > size:
                        raise Refused(f"blob {digest}: more than the {size} bytes expected")
                    hasher.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unusable(f"cannot reach {self.server}: {exc}") from None
        except httpx.TransportError as exc:
            raise Refused(f"blob {digest}: the transfer broke off: {exc}") from None
        if received != size or hasher.hexdigest() != digest:
            raise Refused(
                f"blob {digest}: received {received} bytes hashing to {hasher.hexdigest()}, "
                f"expected {size} bytes"
            )

    # --- plumbing ---------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unusable(f"cannot reach {self.server}: {exc}") from None
        except httpx.TransportError as exc:
            raise Refused(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    def _ok(self, response: httpx.Response, what: str) -> httpx.Response:
        """``response`` if it succeeded; else Unusable for a refused token, Refused
        for anything else."""
        if response.status_code < 400:
            return response
        response.read()
        body: Any = None
        try:
            body = response.json()
            detail = body.get("detail", response.text) if isinstance(body, dict) else body
        except ValueError:
            detail = response.text[:200]
        if response.status_code in (401, 403):
            raise TokenRefused(
                f"{self.server} refused the token (HTTP {response.status_code}): {detail}"
            )
        raise Refused(
            f"{what}: {self.server} answered {response.status_code}: {detail}",
            response.status_code,
            body,
        )

    def _json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise Refused(f"{self.server} answered something that is not JSON") from None


def _absent(response: httpx.Response) -> bool:
    """A 404 of the server's own (no such entry), not of a route it lacks."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("reason") == "absent"
