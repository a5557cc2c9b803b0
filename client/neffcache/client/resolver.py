"""The one decision for a graph that missed in L1: served by the server, served by the
host that compiles it, a failure replayed, or compiled here (holding the fleet's lease
or not). Two adapters ask it: ``session.py`` for the compiler's argv (the shim and
``neffcache wrap``, which run the compiler themselves) and ``proxy.py`` for
libneuronxla's cache calls (the hook, where the SDK compiles). Neither is imported
here.

The steps, whoever asks: ``lookup`` (the server, cheapest name first), ``fleet`` (the
lease: hold it, or wait for its holder's entry or failure), then the caller compiles,
keeps and publishes, and ``release`` ends the lease with ``failure_notice``'s verdict.
What an adapter cannot share (L1's two layouts: manifests by key for the wrapper, the
SDK's entry folders for the hook; who runs the compiler) stays in the adapter.

Where the adapters' policies differ, the difference is a field of ``Policy``, named
and documented there, rather than a second copy of the step.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from neffcache.client.config import ClientConfig
from neffcache.client.manifests import Manifest
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    from neffcache.client.lease import Leases
    from neffcache.client.local import LocalStore
    from neffcache.client.remote import Remote


class Policy(NamedTuple):
    """Where the wrapper and the hook decide differently, each for a reason of its own."""

    # The wrapper (True) replays a failure another host's compile reported while it
    # waited: its caller takes an exit code and a log. The hook (False) cannot hand
    # libneuronxla an exit code; the SDK compiles, and the address is not leased
    # again in this process.
    replay_fleet_failures: bool
    # The hook (True) remembers, for its cache object's life, the names whose wait
    # failed or was abandoned and never asks for their lease again. The wrapper (False)
    # is a process per graph.
    remember_skips: bool
    # The hook (True) leases stock addresses, which do not cover the compile-affecting
    # environment: an entry found by address must have been compiled under this
    # process's (``same_environment``). The wrapper's names are keys, which cover it.
    check_environment: bool
    # The hook (True) asks for no lease while the server is marked down: the SDK's
    # probes come often, and a skip says nothing. The wrapper (False) asks anyway, and
    # says why it compiles without one (the server gave no lease).
    skip_when_down: bool


WRAPPER = Policy(
    replay_fleet_failures=True, remember_skips=False, check_environment=False, skip_when_down=False
)
HOOK = Policy(
    replay_fleet_failures=False, remember_skips=True, check_environment=True, skip_when_down=True
)


# -- outcomes -----------------------------------------------------------------------


class Served(NamedTuple):
    """Another host compiled the graph: ``entry`` is its published manifest."""

    entry: Manifest


class Replay(NamedTuple):
    """The graph failed to compile while this caller waited: replay ``code`` (the
    compiler's exit code) and ``log`` (its tail) rather than fail the same way again."""

    code: int
    log: str | None
    reason: str


class Compile(NamedTuple):
    """Compile here. ``held``: this process holds the lease (``release`` it after the
    publish); else ``reason`` says why there is none, when there is one to say.
    ``again``: nobody holds the name, or a live rank of this host does, so the next
    call asks again (the hook says nothing of these; the wrapper gives the reason)."""

    held: bool
    reason: str = ""
    again: bool = False


Outcome = Served | Replay | Compile


class Resolver:
    """One caller's view of the decision (a wrapper call; the hook's cache object).

    ``remote`` and ``leases`` are called on first use: an L1 hit never builds the HTTP
    client, and the hook shares one ``Leases`` per process (lease.shared_leases)."""

    def __init__(
        self,
        config: ClientConfig,
        policy: Policy,
        remote: Callable[[], Remote],
        leases: Callable[[], Leases],
    ) -> None:
        self.config = config
        self.policy = policy
        self._remote = remote
        self._make_leases = leases
        self.leases: Leases | None = None  # made on the first question
        self._skipped: set[str] = set()  # names not to lease again (Policy.remember_skips)

    # -- lookup -----------------------------------------------------------------------

    def lookup(
        self,
        *,
        address: str | None = None,
        direct: str | None = None,
        canonical: Callable[[], str | None] | None = None,
    ) -> Manifest | None:
        """The server's entry for the graph, by each name given, cheapest first: its
        stock address (checked against this environment), its direct key (an alias),
        its canonical key (called only when needed: keying it parses the module)."""
        remote = self._remote()
        if address is not None:
            found = self._usable(remote.alias(address))
            if found is not None:
                return found
        if direct is not None:
            found = remote.alias(direct)
            if found is not None:
                return found
        key = None if canonical is None else canonical()
        return None if key is None else remote.entry(key)

    def _usable(self, entry: Manifest | None) -> Manifest | None:
        return same_environment(entry) if self.policy.check_environment else entry

    # -- the fleet's lease ------------------------------------------------------------

    def fleet(self, name: str, began: float, *, take: bool = True) -> Outcome:
        """Hold the lease on ``name`` or wait for its holder (lease.py); ``began``
        (``time.time()``): when the caller began to wait for this graph. ``take=False``
        only waits (the hook's probe before the SDK's lock, which may compile nothing).
        A ``Compile`` with a ``reason`` is one the caller says; it logs it."""
        if name in self._skipped:
            return Compile(held=False)
        if self.policy.skip_when_down and not self._remote().available():
            return Compile(held=False)
        if self.leases is None:
            self.leases = self._make_leases()
        wait = self.leases.acquire_or_wait(name, began=began, take=take)
        if wait.state == "granted":
            return Compile(held=True)
        if wait.state == "done":
            entry = self._usable(wait.entry)
            # Compiled under another environment (the hook): compile, and ask next time.
            return Compile(held=False) if entry is None else Served(entry)
        if wait.state in ("free", "local"):
            # Nobody holds it (the lock step takes it), or a live rank of this host
            # does: it may die, so ask again next time.
            return Compile(held=False, reason=wait.reason, again=True)
        replays = self.policy.replay_fleet_failures
        if wait.state == "failed" and wait.failure is not None and replays:
            # A record that does not say how it failed, or a failure of its host (a
            # signal): compile, and say nothing of it.
            return _replay_of(wait.failure, wait.reason) or Compile(held=False)
        if self.policy.remember_skips:
            self._skipped.add(name)  # a failed or abandoned wait: not asked again
        return Compile(held=False, reason=wait.reason)

    def release(self, name: str | None, *, failed: bool) -> None:
        """End the lease on ``name`` if this process holds it, after the publish: the
        waiters its release wakes then find the entry. ``failed`` (failure_notice)
        tells them to stop waiting."""
        if name is not None and self.leases is not None:
            self.leases.release(name, failed)


def failure_notice(code: int | None, published: bool) -> bool:
    """Whether a lease's release tells its waiters to stop waiting, once its holder's
    compile (exit ``code``; None: it failed, how is not known) is over: the graph failed
    to compile (they replay it or compile it themselves), or it compiled and nothing
    could be published (they compile at once rather than one after another). A failure
    of this host (a signal, a compiler that cannot start) is no notice: one of them
    takes over, as from a dead holder."""
    if code is None:
        return True
    return (code == 0 and not published) or replayable(code)


def replayable(code: int) -> bool:
    """Whether a compiler's exit code is the graph's failure, which another host would
    meet too, rather than this host's: killed by a signal (negative: the OOM killer,
    say), or not runnable (126, 127)."""
    return code > 0 and code not in (126, 127)


def _replay_of(record: dict[str, Any] | None, reason: str) -> Replay | None:
    """A failure record (the server's, on a lease's answer) as a replay; None when it
    does not say how the graph failed, or the failure was its host's."""
    code = None if record is None else record.get("exit_code")
    # An exit status is 1 to 255: 256 would exit 0 (a "failure" that wrote no NEFF
    # and succeeded), and a bool is an int too.
    if record is None or type(code) is not int or not 0 < code < 256 or not replayable(code):
        return None
    text = record.get("log")
    return Replay(code, text if isinstance(text, str) else None, reason)


def replay(found: Replay, note: Callable[[str], None]) -> int:
    """A replayed failure's log on stderr and through ``note`` (the caller's logfile);
    its exit code."""
    if found.log is not None:
        sys.stderr.write(found.log)
        note(found.log)
    STATS.count(ClientCounter.FAILURES_REPLAYED)
    return found.code


# -- failures seen by the ranks of one host -------------------------------------------
#
# The hook's ranks read the SDK's own record (``model.log``, proxy.py); the wrapper's
# keep one in L1, by key, for the ranks that waited on the key's lock.


def _failure_path(local: LocalStore, key: str) -> Path:
    return local.root / "failures" / f"{key}.json"


def remember_failure(local: LocalStore, key: str, code: int, log_tail: str) -> None:
    """Record a compile's failure for the ranks of this host waiting on its lock."""
    if not replayable(code):  # this host's trouble (a signal, no --output): not the graph's
        return
    from neffcache.client.local import atomic_write

    record = {"exit_code": code, "log": log_tail[-8192:], "time": time.time()}
    with contextlib.suppress(OSError):  # waiters then compile: slower, never wrong
        atomic_write(_failure_path(local, key), json.dumps(record).encode())


def failed_while_waiting(local: LocalStore, key: str, waited_from: float) -> Replay | None:
    """The holder's failure, if it failed while this rank waited; else None."""
    try:
        record = json.loads(_failure_path(local, key).read_bytes())
        when, _ = record["time"], record["log"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(when, (int, float)) or when < waited_from:
        return None
    reason = "the rank that held the lock failed to compile this graph"
    return _replay_of(record if isinstance(record, dict) else None, reason)


def same_environment(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """``manifest`` if it was compiled under this process's compile-affecting
    environment, else None. A stock address does not cover the environment
    (docs/neuron-sdk.md#stock-address) while neffcache's key does: an entry found by
    address must agree."""
    if manifest is None:
        return None
    from neffcache.keying import compile_env

    # An entry without components (imported from a stock cache) was keyed without an
    # environment: it matches a process that sets none of the variables.
    components = manifest.get("components")
    theirs = components.get("env", {}) if isinstance(components, dict) else {}
    if theirs != compile_env(os.environ):
        STATS.count(ClientCounter.ADDRESS_ENV_MISMATCHES)
        return None
    # The NKI version likewise, when the entry was keyed by neffcache (an imported
    # stock entry never recorded one: served as the stock cache would serve it).
    if isinstance(components, dict) and "frameworks" in components:
        from neffcache.client.keys import framework_versions

        if components["frameworks"] != framework_versions():
            STATS.count(ClientCounter.ADDRESS_ENV_MISMATCHES)
            return None
    return manifest
