"""The server's HTTP API (docs/protocol.md) as the bridge uses it, through the
client's ``api.Api`` (its own HTTP and the protocol's paths).

Two kinds of trouble, as two exceptions:

* ``Unusable``: the run cannot go on (the server cannot be reached, or answers as no
  server of this version would). The command stops with one line (exit 1); as
  ``TokenRefused`` when it refuses the token (exit 2: bad input).
* ``Refused``: one request failed (a blob refused, a server error, a transfer cut
  short). Only the entry at hand fails; the run goes on.

Unlike the runtime's ``neffcache.client.remote.Remote``, which turns all trouble into a
miss so that a training job never waits on the cache, a person runs the bridge and
wants to know what failed: its trouble is raised.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import blake3

from neffcache.client.api import Api
from neffcache.client.http import (
    REDIRECTS,
    ConnectFailed,
    Connection,
    HttpError,
    Response,
    SinkError,
    redirect_target,
)
from neffcache.protocol import is_hex64, routes

# The server's own limit on one POST /v1/blobs/missing.
_MISSING_MAX = 10_000
# Connecting is quick or never; each read or write may wait this long, and a request
# as a whole this long plus its bytes at _MIN_RATE (a large blob on a slow link).
_CONNECT_TIMEOUT = 10.0
_TIMEOUT = 120.0
_MIN_RATE = 1 << 20  # bytes per second
_MAX_REDIRECTS = 3
# A page of the entry listing (up to 1000 manifests) is far below this.
_PAGE_LIMIT = 64 << 20


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
    """One namespace of one server. ``connection``: the HTTP connection to use (tests
    script one); by default one to ``server``. Not thread-safe: one per thread.

    >>> remote = Remote("http://cache.internal:8787", "team-a", token=None)
    >>> remote.namespace
    'team-a'
    """

    def __init__(
        self,
        server: str,
        namespace: str,
        token: str | None,
        *,
        connection: Connection | None = None,
    ) -> None:
        self.server = server
        self.namespace = namespace
        if connection is None:
            try:
                connection = Connection(server, _CONNECT_TIMEOUT, _TIMEOUT)
            except HttpError as exc:
                raise Unusable(str(exc)) from None
        self._api = Api(connection, namespace, token)

    def close(self) -> None:
        self._api.close()

    # --- entries ----------------------------------------------------------------------

    def entry(self, key: str) -> dict[str, Any] | None:
        """The entry under ``key``, or None."""
        response = self._send("GET", routes.entry_path(self.namespace, key))
        if response.status == 404:
            return None
        found: dict[str, Any] = self._json(self._ok(response, f"entry {key}"))
        return found

    def put_entry(self, key: str, manifest: dict[str, Any]) -> int:
        """PUT a manifest: 201 created, 200 the same one was there, 409 a different one
        is; Refused otherwise (``body["missing"]`` names blobs the server lacks)."""
        response = self._send("PUT", routes.entry_path(self.namespace, key), json_body=manifest)
        if response.status not in (200, 201, 409):
            self._ok(response, f"entry {key}")  # raises for an error status
            raise Refused(f"entry {key}: unexpected HTTP {response.status}")
        return response.status

    def add_alias(self, alias: str, key: str) -> bool:
        """Make ``alias`` (a Neuron address or a direct key) name the entry ``key``:
        True when added now, False when it already named it or names another key.
        Refused otherwise; a server without the route is Unusable."""
        path = routes.alias_path(self.namespace, alias)
        response = self._send("PUT", path, json_body={"key": key})
        if response.status == 405:
            raise Unusable(
                f"{self.server} cannot add aliases (HTTP 405); it may predate "
                "PUT /v1/ns/{ns}/aliases/{alias}: upgrade it"
            )
        if response.status == 409:
            return False
        self._ok(response, f"alias {alias}")
        return response.status == 201

    def aliases(self, key: str) -> list[str]:
        """Every alias naming the entry ``key`` (direct keys and Neuron addresses);
        ``[]`` when the entry is gone. A server without the route is Unusable."""
        response = self._send("GET", self._api.entry_aliases_path(key))
        if response.status == 404 and _absent(response):
            return []
        if response.status in (404, 405):
            raise Unusable(
                f"{self.server} cannot list an entry's aliases (HTTP {response.status}); "
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
            path = self._api.entries_page_path(limit, after)
            response = self._send("GET", path, limit=_PAGE_LIMIT)
            if response.status in (404, 405):
                raise Unusable(
                    f"{self.server} cannot list entries (HTTP {response.status}); "
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
            response = self._send("POST", routes.BLOBS_MISSING, json_body={"digests": chunk})
            lacking += self._json(self._ok(response, "the blob check"))["missing"]
        return lacking

    def put_blob(self, digest: str, file: BinaryIO, size: int) -> None:
        """Upload an open file, streamed; Refused if the server does not take it."""
        response = self._send(
            "PUT",
            routes.blob_path(digest),
            body_file=(file, size),
            headers={"Content-Type": "application/octet-stream"},
            timeout=_TIMEOUT + size / _MIN_RATE,
        )
        self._ok(response, f"blob {digest}")

    def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
        """Download a blob into ``dest``, checking its size and BLAKE3 digest; Refused
        when it is absent, short, longer (it stops at ``size``: a broken server must
        not fill the disk) or not what it should be (``dest`` may hold a part)."""
        hasher = blake3.blake3()
        received = 0
        with dest.open("wb") as out:

            def sink(chunk: bytes) -> None:
                nonlocal received
                if received + len(chunk) > size:
                    raise Refused(f"blob {digest}: more than the {size} bytes expected")
                hasher.update(chunk)
                out.write(chunk)
                received += len(chunk)

            path = routes.blob_path(digest)
            timeout = _TIMEOUT + size / _MIN_RATE
            response = self._send("GET", path, sink=sink, timeout=timeout)
            if response.status in REDIRECTS:
                response = self._follow(response, self.server + path, sink, timeout, digest)
        self._ok(response, f"blob {digest}")
        if received != size or hasher.hexdigest() != digest:
            raise Refused(
                f"blob {digest}: received {received} bytes hashing to {hasher.hexdigest()}, "
                f"expected {size} bytes"
            )

    def _follow(
        self, response: Response, url: str, sink: Any, timeout: float, digest: str
    ) -> Response:
        """Follow a blob download's redirects (a server that sends large blobs from
        presigned S3 URLs, ``blob_redirect_seconds``), as the runtime does: no token to
        the redirect's host (S3 refuses a presigned request that carries one), at most
        ``_MAX_REDIRECTS``; Refused on trouble, which skips this entry."""
        for _ in range(_MAX_REDIRECTS):
            try:
                origin, target = redirect_target(url, response.headers.get("location", ""))
                url = origin + target
                conn = Connection(origin, _CONNECT_TIMEOUT, _TIMEOUT)
                try:
                    response = conn.request("GET", target, sink=sink, timeout=timeout)
                finally:
                    conn.close()
            except SinkError as exc:  # as _send: a full disk, or more bytes than expected
                if isinstance(exc.__cause__, (Refused, OSError)):
                    raise exc.__cause__ from None
                raise
            except HttpError as exc:
                raise Refused(f"blob {digest}: its redirect failed: {exc}") from None
            if response.status not in REDIRECTS:
                return response
        raise Refused(f"blob {digest}: more than {_MAX_REDIRECTS} redirects")

    # --- plumbing ---------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Response:
        """One request; Unusable when no connection could be opened, Refused when it
        broke off (the run goes on without this entry), OSError when ``sink`` could
        not write, and a sink's Refused as it was raised."""
        try:
            return self._api.request(method, path, json_body=json_body, headers=headers, **kwargs)
        except ConnectFailed as exc:
            raise Unusable(f"cannot reach {self.server}: {exc}") from None
        except SinkError as exc:
            if isinstance(exc.__cause__, (Refused, OSError)):
                raise exc.__cause__ from None
            raise
        except HttpError as exc:
            raise Refused(f"{method} {path.partition('?')[0]}: {exc}") from None

    def _ok(self, response: Response, what: str) -> Response:
        """``response`` if it succeeded; else Unusable for a refused token, Refused
        for anything else."""
        if response.status < 400:
            return response
        body: Any = None
        try:
            body = json.loads(response.body)
            detail = body.get("detail", _text(response)) if isinstance(body, dict) else body
        except ValueError:
            detail = _text(response)[:200]
        if response.status in (401, 403):
            raise TokenRefused(
                f"{self.server} refused the token (HTTP {response.status}): {detail}"
            )
        raise Refused(
            f"{what}: {self.server} answered {response.status}: {detail}", response.status, body
        )

    def _json(self, response: Response) -> Any:
        try:
            return json.loads(response.body)
        except ValueError:
            raise Refused(f"{self.server} answered something that is not JSON") from None


def _text(response: Response) -> str:
    return response.body.decode("utf-8", errors="replace")


def _absent(response: Response) -> bool:
    """A 404 of the server's own (no such entry), not of a route it lacks."""
    try:
        body = json.loads(response.body)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("reason") == "absent"
