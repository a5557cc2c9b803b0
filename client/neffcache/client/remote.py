"""The neffcache server as the client sees it: every answer is a value, never an error.

A miss is None. So is trouble (connection refused, a timeout, a 5xx, a malformed
answer): it is counted, logged once, and the server is considered down for this
process for ``NEFFCACHE_BACKOFF`` seconds, during which calls return at once and the
graph compiles locally (sccache's and ccache's policy). Downloads are verified against
their BLAKE3 digest before they become visible; a mismatch is a miss, and is reported
to the server once (``report_mismatch``), so that it verifies its copy again.

A refused token is backed off the same way, and said once per process whatever the
back-off: a 401 (no token, an unknown one) or a 403 to a read (a namespace the token
does not cover) skips the server for this namespace and token, and the misses meanwhile
give the refusal as their reason (``refusal``); a 403 to a write (a read-only token)
skips only writes (publishes, blob uploads, failure reports, leases), while lookups go
on.

A lookup asks for the entry's NEFF inline (docs/protocol.md#a-file-inline): a server
that sends it answers a hit in one response instead of two, and the bytes wait here
for the download that would have fetched them, which then verifies them as any other.

A blob download may be redirected (the server's S3 store hands out presigned URLs):
the client follows a few hops, to any http(s) host, on a fresh connection each,
without its token and within the download's own deadline, and verifies what arrives
exactly as it would the server's bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import blake3

from neffcache.client._log import log
from neffcache.client.api import Api
from neffcache.client.compile_call import NEFF
from neffcache.client.config import ClientConfig
from neffcache.client.http import (
    BODY_LIMIT,
    REDIRECTS,
    Connection,
    HttpError,
    Response,
    SinkError,
    redirect_target,
)
from neffcache.client.local import LocalStore, new_temp
from neffcache.client.manifests import Manifest, checked, is_digest, is_size
from neffcache.client.stats import STATS
from neffcache.protocol import LeaseOutcome, inline, routes
from neffcache.protocol.counters import ClientCounter

# Blob transfers get the request timeout plus this much time per byte: a 256 MiB NEFF
# over a slow link must not count as a dead server, a stalled one must still end.
_MIN_RATE = 8 * 2**20  # bytes per second
# A lookup asks for the NEFF inline up to this size (protocol/inline.py); a larger one
# comes as a download, which streams to disk rather than into memory.
INLINE_MAX = 8 * 2**20
_INLINE_ASK = {inline.HEADER: inline.asked(NEFF, INLINE_MAX)}
_INLINE_SECONDS = INLINE_MAX / _MIN_RATE
# Redirects a blob download follows: the server's one to its store, and a few more for
# whatever sits in front of the store; a loop ends here.
_MAX_REDIRECTS = 5
_down_until: dict[str, float] = {}  # server (or "server scope") -> skipped until
# Why a name of _down_until is skipped, when the server refused the token: the miss
# reason (reasons.UNAUTHORIZED, reasons.FORBIDDEN) of every graph meanwhile.
_refusals: dict[str, str] = {}
# Refusals said in this process, by (name, cause): a training process outlives many
# back-off periods, and the fix is the same after each.
_said: set[tuple[str, str]] = set()
# The scope of telemetry and explanations: their trouble skips them, not the cache.
# The one scope so far; a new one is a new Literal, and new counters in _call and
# _mark_down.
Scope = Literal["telemetry"]
TELEMETRY: Scope = "telemetry"
_down_lock = threading.Lock()
# Digests this process reported as arriving with other bytes: each is reported once.
_reported: set[str] = set()
_REPORTED_MAX = 1024
# Seconds a mismatch report may take at most: the graph compiles next, and waits.
_REPORT_TIMEOUT = 2.0


def _after_fork_in_child() -> None:
    # Telemetry's thread checks the back-off every second: a child forked while it held
    # this lock would wait for it forever on its first request.
    global _down_lock
    _down_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def lookup_seconds(config: ClientConfig) -> float:
    """The longest a lookup may take, connecting included, with its NEFF inline."""
    return config.connect_timeout + config.timeout + _INLINE_SECONDS


def _framed(response: Response) -> bool:
    """Whether a lookup's answer carries a file inline (protocol/inline.py): its media
    type says so, whatever its parameters or case, or, the type lost or rewritten on
    the way (a proxy), its body starts with the length, as a JSON object never does."""
    media = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == inline.MEDIA_TYPE:
        return True
    return media != "application/json" and response.body[:1].isdigit()


class _TooLong(Exception):
    """The server sent more bytes than the manifest's size."""


class Remote:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._local = threading.local()
        self._ns = config.namespace
        # A refusal is this token's in this namespace, not the server's: another job of
        # the host, with its own token or namespace, keeps using the server.
        ident = blake3.blake3(f"{config.namespace} {config.token or ''}".encode()).hexdigest()
        self._refused_as = f"{config.server} refused {ident[:16]}"
        self._writes_as = f"{config.server} writes {ident[:16]}"

    # -- state ------------------------------------------------------------------------

    def available(self, scope: Scope | None = None) -> bool:
        """False while the server is marked down after an error or a refused token, by
        this process or by another on this host (the wrapper is a new process per
        graph: without the shared mark each would pay the timeout again). With a
        ``scope`` (``TELEMETRY``), also False while that scope alone is marked down."""
        if not self._up(self.config.server) or not self._up(self._refused_as):
            return False
        return scope is None or self._up(f"{self.config.server} {scope}")

    def skips(self) -> bool:
        """True while the server is marked down (``available``), counted as a call
        skipped (``server_skipped``): for a caller that skips before building a
        request, as the shim's lookups count theirs in ``_call``."""
        if self.available():
            return False
        STATS.count(ClientCounter.SERVER_SKIPPED)
        return True

    def writable(self) -> bool:
        """False while writes are skipped after the server refused one (a read-only
        token), by this process or by another on this host."""
        return self._up(self._writes_as)

    def refusal(self) -> str | None:
        """``unauthorized`` or ``forbidden`` while the server is skipped because it
        refused this token in this namespace; else None (up, or down for trouble)."""
        if self._up(self._refused_as):
            return None
        with _down_lock:
            return _refusals.get(self._refused_as)

    def _up(self, name: str) -> bool:
        with _down_lock:
            if time.monotonic() < _down_until.get(name, 0.0):
                return False
        until, cause = self._shared_mark(name)
        if until > time.time():
            with _down_lock:
                _down_until[name] = time.monotonic() + (until - time.time())
                if cause:
                    _refusals[name] = cause
            return False
        return True

    def _mark_path(self, name: str | None = None) -> Path:
        digest = blake3.blake3((name or self.config.server).encode()).hexdigest()[:16]
        return Path(self.config.local_dir) / ".neffcache" / "down" / digest

    def _shared_mark(self, name: str) -> tuple[float, str | None]:
        """Until when another process marked ``name`` down, and the refusal why."""
        try:
            until, _, cause = self._mark_path(name).read_text().partition(" ")
            return float(until), cause.strip() or None
        except (OSError, ValueError):
            return 0.0, None

    def _back_off(self, name: str, cause: str | None = None) -> bool:
        """Skip ``name`` for the back-off period, in every process of the host (the
        mark lives in L1); True when it was not skipped already here."""
        with _down_lock:
            first = time.monotonic() >= _down_until.get(name, 0.0)
            _down_until[name] = time.monotonic() + self.config.backoff
            if cause:
                _refusals[name] = cause
        if self.config.backoff > 0:
            from neffcache.client.local import atomic_write

            with contextlib.suppress(OSError):  # then only this process skips the server
                until = repr(time.time() + self.config.backoff)
                atomic_write(self._mark_path(name), f"{until} {cause or ''}".strip().encode())
        return first

    def _mark_down(self, what: str, reason: object, scope: Scope | None = None) -> None:
        """Skip the server (or only ``scope``'s requests) for the back-off period."""
        name = self.config.server if scope is None else f"{self.config.server} {scope}"
        STATS.count(
            ClientCounter.SERVER_ERRORS if scope is None else ClientCounter.TELEMETRY_ERRORS
        )
        first = self._back_off(name)
        if first and scope is None:
            log.warning(
                "neffcache: %s failed (%s); compiling locally, server %s skipped for %.0f s",
                what,
                reason,
                self.config.server,
                self.config.backoff,
            )
        elif first:
            log.warning(
                "neffcache: %s failed (%s); %s skipped for %.0f s (the cache is not)",
                what,
                reason,
                scope,
                self.config.backoff,
            )

    def _connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = Connection(self.config.server, self.config.connect_timeout, self.config.timeout)
            self._local.conn = conn
        return conn

    def _api(self) -> Api:
        """This thread's ``Api``, over its connection."""
        api: Api | None = getattr(self._local, "api", None)
        if api is None:
            api = Api(self._connection(), self._ns, self.config.token)
            self._local.api = api
        return api

    def close(self) -> None:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        gated: bool = True,
        forbidden_ok: bool = False,
        scope: Scope | None = None,
        write: bool = False,
        **kwargs: Any,
    ) -> Response | None:
        """One request; None (counted, server marked down) when it did not complete,
        the server failed (5xx) or refused the token (401, 403: ``_refused``).
        ``gated=False`` sends it even while the server is marked down (lease renewals:
        a holder must not lose its lease to a back-off longer than the lease's life).
        ``forbidden_ok``: a 403 is the answer, for the caller to read. ``scope``
        (``TELEMETRY``): trouble marks down only that scope, so that a slow events
        endpoint never turns a cache hit into a compile. ``write``: a publish's
        request, skipped while writes are (a 403 to it skips writes, not reads)."""
        if gated and not self.available(scope):
            STATS.count(
                ClientCounter.SERVER_SKIPPED if scope is None else ClientCounter.TELEMETRY_SKIPPED
            )
            return None
        if gated and write and not self.writable():
            STATS.count(ClientCounter.WRITES_SKIPPED)
            return None
        try:
            response = self._api().request(method, path, **kwargs)
        except HttpError as exc:
            self._mark_down(what, exc, scope)
            return None
        if response.status >= 500:
            self._mark_down(what, f"HTTP {response.status}", scope)
            return None
        if response.status == 401 or (response.status == 403 and not forbidden_ok):
            self._refused(response, write)
            return None
        return response

    def _refused(self, response: Response, write: bool) -> None:
        """The server refused the token: skip what it refuses for the back-off period
        (``_back_off``: every process of the host), and say so once per process, with
        the server's reason (a 403's names the scope wanted and the token's)."""
        from neffcache.client.http import error_detail
        from neffcache.client.reasons import FORBIDDEN, UNAUTHORIZED

        STATS.count(ClientCounter.AUTH_ERRORS)
        detail = f"HTTP {response.status}: {error_detail(response.body)}"
        if response.status == 403 and write:
            name, cause = self._writes_as, "writes"
            self._back_off(name)
        else:
            name, cause = self._refused_as, UNAUTHORIZED if response.status == 401 else FORBIDDEN
            self._back_off(name, cause)
        with _down_lock:
            said = (name, cause) in _said
            _said.add((name, cause))
        if not said:
            log.warning("neffcache: %s", self._refusal_text(cause, detail))

    def _refusal_text(self, cause: str, detail: str) -> str:
        ns, server = self.config.namespace, self.config.server
        later = f"the server is skipped for {self.config.backoff:.0f} s at a time"
        if cause == "writes":
            # The server's 403 names the scope wanted and the token's: "this needs a
            # write token; yours is read". Others (trusted writers only) are said as is.
            found = re.search(r"yours is ([a-z]+)", detail)
            who = f"this token is {found[1]}-only" if found else "this token may not write"
            return (
                f"{who} (namespace {ns}): compiles are not published ({detail}); a token "
                f"with write scope on {ns} publishes them"
            )
        if cause == "forbidden":
            return (
                f"the token may not read namespace {ns} on {server} ({detail}): check the "
                f"namespace at the end of the cache URL, or use a token that covers {ns}; "
                f"graphs compile locally, {later}"
            )
        if self.config.token is None:
            return (
                f"the server at {server} needs a token to read namespace {ns} ({detail}): set "
                f"NEFFCACHE_TOKEN to one with read scope on {ns}; graphs compile locally, {later}"
            )
        return (
            f"the server at {server} does not know NEFFCACHE_TOKEN ({detail}): set it to a "
            f"token of this server with read scope on namespace {ns}; graphs compile "
            f"locally, {later}"
        )

    def _lookup(self, what: str, path: str, name: str) -> Manifest | None:
        """An entry lookup's manifest (checked), asking for its NEFF inline (a hit's
        NEFF is fetched next, unless L1 holds it already); NEFF bytes that came with
        it are kept for ``fetch`` (``_inlined``), replacing any an earlier lookup left."""
        self._local.inlined = None
        response = self._call(
            what,
            "GET",
            path,
            headers=_INLINE_ASK,
            limit=BODY_LIMIT + INLINE_MAX,
            # The time the download it replaces would have had for the NEFF.
            timeout=self.config.timeout + _INLINE_SECONDS,
        )
        if response is None or response.status != 200:
            return None
        body: bytes = response.body
        data = None
        if _framed(response):
            parts = inline.split(body)
            if parts is None:
                self._mark_down(what, "the answer's inline length does not fit its body")
                return None
            body, data = parts
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            self._mark_down(what, "the answer is not JSON")
            return None
        found = checked(value if isinstance(value, dict) else None, name)
        ref = None if found is None else found["files"].get(NEFF)
        # Kept only when the manifest names them, and never more than was asked for.
        if (
            data is not None
            and len(data) <= INLINE_MAX
            and isinstance(ref, dict)
            and ref.get("size") == len(data)
        ):
            self._local.inlined = (ref.get("digest"), data)
        return found

    # -- reads ------------------------------------------------------------------------

    def entry(self, key: str) -> Manifest | None:
        path = routes.entry_path(self._ns, key)
        return self._lookup("entry lookup", path, f"the server's entry {key[:12]}")

    def alias(self, alias: str) -> Manifest | None:
        """By direct key or stock Neuron address."""
        path = routes.alias_path(self._ns, alias)
        return self._lookup("alias lookup", path, f"the server's entry for {alias[:80]}")

    def _inlined(self, digest: str, size: int) -> memoryview | None:
        """The NEFF bytes the last lookup brought, if they are this blob's (by the
        manifest, not yet by their hash: ``fetch`` hashes them); taken once. A thread
        keeps at most one lookup's, ``INLINE_MAX`` bytes, until its next lookup."""
        kept: tuple[object, memoryview] | None = getattr(self._local, "inlined", None)
        if kept is None or kept[0] != digest or len(kept[1]) != size:
            return None  # kept for the NEFF's own fetch: an entry's other files come first
        self._local.inlined = None
        return kept[1]

    def fetch(self, digest: str, size: int, dest: Path) -> bool:
        """Download a blob to ``dest`` (atomically, verified); False on any problem.
        A digest or size that is not one (a server's manifest may say anything) is
        refused before it becomes a URL or bounds a download."""
        if not is_digest(digest) or not is_size(size):
            STATS.count(ClientCounter.BAD_MANIFESTS)
            log.warning("neffcache: refused to fetch blob %r of size %r", digest[:80], size)
            return False
        inlined = self._inlined(digest, size)
        if inlined is None and not self.available():
            STATS.count(ClientCounter.SERVER_SKIPPED)
            return False
        try:
            fd, tmp = new_temp(dest.parent, ".fetch-")
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
            log.warning("neffcache: cannot write into %s: %s", dest.parent, exc)
            return False
        hasher = blake3.blake3()
        received = 0
        try:
            with os.fdopen(fd, "wb") as out:

                def sink(chunk: bytes | memoryview) -> None:
                    nonlocal received
                    received += len(chunk)
                    if received > size:
                        raise _TooLong()
                    hasher.update(chunk)
                    out.write(chunk)

                if inlined is not None:
                    sink(inlined)
                elif not self._download(digest, size, sink):
                    return False
            if received != size or hasher.hexdigest() != digest:
                STATS.count(ClientCounter.BAD_DOWNLOADS)
                log.warning("neffcache: blob %s arrived with other bytes; discarded", digest)
                if received == size:  # whole, and wrong: what the server holds may be
                    self.report_mismatch(digest)
                return False
            os.replace(tmp, dest)
            return True
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
            log.warning("neffcache: cannot write %s: %s", dest, exc)
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _download(self, digest: str, size: int, sink: Callable[[bytes], None]) -> bool:
        """GET the blob into ``sink``, following redirects; True when it answered 200
        (the caller checks what arrived)."""
        budget = self.config.timeout + size / _MIN_RATE
        deadline = time.monotonic() + budget
        path = routes.blob_path(digest)
        try:
            response = self._call("blob download", "GET", path, sink=sink, timeout=budget)
            if response is not None and response.status in REDIRECTS:
                response = self._follow(response, self.config.server + path, sink, deadline)
        except SinkError as exc:
            if isinstance(exc.__cause__, _TooLong):
                self._mark_down("blob download", f"blob {digest} is too long")
                return False
            raise OSError(str(exc)) from exc
        return response is not None and response.status == 200

    def _follow(
        self,
        response: Response,
        url: str,
        sink: Callable[[bytes], None],
        deadline: float,
    ) -> Response | None:
        """Follow a blob download's redirects from ``url``; the final answer, or None
        on trouble (counted, server marked down: a store that cannot be reached costs
        every download its timeout, as a server that cannot would). No Authorization
        goes to the redirect's host: the token is for the server only, and S3 refuses
        a presigned request that also carries one. A 404 there is a plain miss (the
        blob went after the server answered)."""
        what = "blob download (redirected)"
        for _ in range(_MAX_REDIRECTS):
            try:
                origin, target = redirect_target(url, response.headers.get("location", ""))
                url = origin + target
                if deadline - time.monotonic() <= 0:
                    raise HttpError("the download ran out of time")
                conn = self._redirect_connection(origin)
                try:
                    response = conn.request(
                        "GET", target, sink=sink, timeout=deadline - time.monotonic()
                    )
                finally:
                    conn.close()
            except HttpError as exc:
                self._mark_down(what, exc)
                return None
            if response.status not in REDIRECTS:
                if response.status == 404 or 200 <= response.status < 300:
                    return response
                self._mark_down(what, f"HTTP {response.status} from {origin}")
                return None
        self._mark_down(what, f"more than {_MAX_REDIRECTS} redirects")
        return None

    def report_mismatch(self, digest: str) -> None:
        """Tell the server that ``digest`` was downloaded whole with other bytes, so it
        hashes its copy again and quarantines it if it is corrupt (its reads may trust
        a file verified before, and rot beneath a filesystem changes no stamp). Once
        per digest per process; best effort, within ``_REPORT_TIMEOUT``; trouble marks
        down only telemetry's scope, never the cache."""
        with _down_lock:
            if digest in _reported or len(_reported) >= _REPORTED_MAX:
                return
            _reported.add(digest)
        self._call(
            "reporting a blob that did not match its digest",
            "POST",
            routes.blob_mismatch_path(digest),
            body=b"",
            timeout=min(self.config.timeout, _REPORT_TIMEOUT),
            scope=TELEMETRY,
        )

    def _redirect_connection(self, origin: str) -> Connection:
        """A connection of its own to a redirect's host, closed after its one request."""
        return Connection(origin, self.config.connect_timeout, self.config.timeout)

    def fetch_into(self, local: LocalStore, digest: str, size: int) -> str | None:
        """Make sure L1 holds the blob: ``"l1"`` when it did, ``"server"`` when it was
        downloaded now, None when it could not be had. One download per blob per host:
        concurrent callers (ranks, prewarm) wait on one lock and find it there."""
        if not is_digest(digest) or not is_size(size):
            STATS.count(ClientCounter.BAD_MANIFESTS)
            return None
        if local.has_blob(digest, size):
            self._inlined(digest, size)  # not needed if they are this blob's: L1 holds it
            return "l1"
        with local.lock(f"blob-{digest}", f"the download of {digest[:12]}"):
            if local.has_blob(digest, size):
                return "l1"
            if not self.fetch(digest, size, local.blob_path(digest)):
                return None
        return "server"

    # -- writes -----------------------------------------------------------------------

    def missing(self, digests: list[str]) -> list[str] | None:
        response = self._call(
            "blob check",
            "POST",
            routes.BLOBS_MISSING,
            json_body={"digests": digests},
            write=True,  # a publish's first step: nothing to ask while writes are skipped
        )
        if response is None or response.status != 200:
            return None
        try:
            missing = json.loads(response.body)["missing"]
        except (ValueError, KeyError, TypeError):
            return None
        return [d for d in missing if isinstance(d, str)]

    def put_blob(self, digest: str, path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                response = self._call(
                    "blob upload",
                    "PUT",
                    routes.blob_path(digest),
                    body_file=(f, size),
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=self.config.timeout + size / _MIN_RATE,
                    write=True,
                )
        except OSError as exc:
            STATS.count(ClientCounter.LOCAL_ERRORS)
            log.warning("neffcache: cannot read %s for upload: %s", path, exc)
            return False
        return response is not None and response.status in (200, 201)

    def put_entry(self, key: str, manifest: Manifest) -> Response | None:
        return self._call(
            "publish",
            "PUT",
            routes.entry_path(self._ns, key),
            json_body=manifest,
            write=True,
        )

    def put_alias(self, alias: str, key: str) -> bool:
        """Make ``alias`` (a direct key or a Neuron address) name the entry ``key``;
        True when it does now (or already did), False when it names another key or
        on trouble."""
        response = self._call(
            "alias publish",
            "PUT",
            routes.alias_path(self._ns, alias),
            json_body={"key": key},
            write=True,
        )
        return response is not None and response.status in (200, 201)

    def put_failure(self, key: str, record: dict[str, Any]) -> bool:
        response = self._call(
            "failure report",
            "PUT",
            routes.failure_path(self._ns, key),
            json_body=record,
            write=True,
        )
        return response is not None and response.status in (200, 201)

    # -- telemetry and explanations (scope TELEMETRY) -----------------------------------

    def events(self, body: bytes, timeout: float | None = None) -> int | None:
        """``POST /v1/events``; the status, or None on trouble (telemetry backs off)."""
        response = self._call(
            "sending telemetry",
            "POST",
            routes.EVENTS,
            body=body,
            headers={"Content-Type": "application/json"},
            timeout=timeout,
            scope=TELEMETRY,
        )
        return None if response is None else response.status

    def explain(self, body: bytes, timeout: float | None = None) -> Response | None:
        """``POST /v1/ns/{ns}/explain``: why a key missed; None on trouble."""
        return self._call(
            "asking why a graph missed",
            "POST",
            routes.explain_path(self._ns),
            body=body,
            headers={"Content-Type": "application/json"},
            timeout=timeout,
            scope=TELEMETRY,
        )

    # -- leases -----------------------------------------------------------------------

    def lease(
        self,
        name: str,
        wait: float,
        holder: str,
        *,
        expected: float | None = None,
        waited: float = 0.0,
        dead_holder: str | None = None,
        take: bool = True,
    ) -> LeaseAnswer | None:
        """Ask for the lease on ``name``, waiting up to ``wait`` seconds for the entry
        or the lease (docs/protocol.md); None on trouble, from a server without leases,
        or for a token that may not take them (read scope: writes are then skipped)."""
        body: dict[str, Any] = {
            "holder": holder,
            "wait": wait,
            "waited": round(waited, 3),
            "take": take,
        }
        if expected is not None:
            body["expected_seconds"] = expected
        if dead_holder is not None:
            body["dead_holder"] = dead_holder
        response = self._call(
            "lease request",
            "POST",
            routes.lease_path(self._ns, name),
            json_body=body,
            wait=wait,
            write=True,  # leases need write scope: a read-only token compiles unleased
        )
        if response is None or response.status not in (200, 201, 202):
            return None
        try:
            answer = json.loads(response.body)
            state = answer["state"]
            entry = checked(answer.get("entry"), f"the entry in the lease answer for {name[:80]}")
            failure = answer.get("failure")
            return LeaseAnswer(
                state=state,
                lease=str(answer.get("lease") or ""),
                ttl=float(answer.get("ttl") or 0.0),
                holder=str(answer.get("holder") or ""),
                held_for=float(answer.get("held_for") or 0.0),
                expected_seconds=_number(answer.get("expected_seconds")),
                entry=entry if isinstance(entry, dict) else None,
                failure=failure if isinstance(failure, dict) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            self._mark_down("lease request", "a malformed answer")
            return None

    def renew(self, name: str, lease_id: str) -> bool | None:
        """True: renewed; False: the lease is lost; None: trouble."""
        response = self._call(
            "lease renewal",
            "PUT",
            routes.lease_renew_path(self._ns, name, lease_id),
            gated=False,
            forbidden_ok=True,
        )
        if response is None:
            return None
        return response.status == 200 if response.status in (200, 409) else None

    def release(self, name: str, lease_id: str, failed: bool) -> bool:
        outcome: LeaseOutcome = "failed" if failed else "done"
        path = routes.lease_release_path(self._ns, name, lease_id, outcome)
        response = self._call("lease release", "DELETE", path, gated=False, forbidden_ok=True)
        return response is not None and response.status == 204


class LeaseAnswer(NamedTuple):
    # One of protocol.ANSWER_STATES ("free" only when asked without taking), or a word
    # of a newer server, which lease.py treats as a reason to compile.
    state: str
    lease: str  # the lease id, when granted
    ttl: float  # the server's lease lifetime: renew well within it
    holder: str  # who holds it, when held or failed
    held_for: float  # how long the holder has held it
    expected_seconds: float | None  # how long its compile should take, when known
    entry: Manifest | None  # the entry, when done
    failure: dict[str, Any] | None = None  # the holder's failure record, when failed


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None
