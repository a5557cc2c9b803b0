"""Telemetry: what this process's graphs cost and saved, sent to the server in the
background (``POST /v1/events``, docs/protocol.md) for its reports and metrics.

What is sent: one ``graph`` event per run-manifest line (``runlog.py`` makes both from
one dict, so they cannot disagree), and with each batch one ``counters`` event: how
much each ``Stats`` counter rose since the last counters event the server accepted.
Every event names the namespace and who sent it: job id, host, instance type, model.

Never on the hit path, never in the way:

* ``enqueue`` appends to a bounded queue and returns (O(1)); past ``MAX_QUEUE`` events
  the oldest is dropped and counted (``telemetry_dropped``).
* One daemon thread posts batches of at most ``MAX_BATCH`` events and
  ``MAX_BATCH_BYTES``, through the client's own HTTP client (``Remote``) with its
  timeouts. Nothing is sent while the server is marked down. Trouble (no connection,
  a timeout, a 5xx) marks down the ``telemetry`` scope alone for ``NEFFCACHE_BACKOFF``
  seconds: the events wait in the queue, and the cache is never skipped because of
  telemetry. A batch the server refuses (4xx) is dropped and counted
  (``telemetry_rejected``); a server without ``/v1/events`` gets no more.
* At interpreter exit the queue gets at most ``EXIT_WAIT`` seconds. The compiler
  wrapper (a process per graph) runs no thread, and its caller waits for it to exit:
  it hands its events to a forked child that sends them within the same bound (ended
  by an alarm past it) while the wrapper exits at once (``finish(detach=True)``, from
  ``wrapper.exit_fast``). A caller running the wrapper inline sends them at its exit.
* A forked child starts afresh: no inherited events, and its counters counted from
  the fork on (the parent reports what it counted before).

``NEFFCACHE_TELEMETRY=0`` turns this off. (Miss explanations, ``reasons.py``, are not
telemetry: they answer the run manifest's question of why a graph missed.)
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
import warnings
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.remote import TELEMETRY
from neffcache.client.stats import STATS
from neffcache.protocol import is_counter_name
from neffcache.protocol.counters import ClientCounter

if TYPE_CHECKING:
    from neffcache.client.remote import Remote

MAX_QUEUE = 10_000
MAX_BATCH = 500
MAX_BATCH_BYTES = 1 << 20
# The server's bound on a graph event's components (with the graph summary).
MAX_COMPONENTS_BYTES = 64 * 1024
# Shapes go with a graph's summary only up to this many instructions (the server's).
MAX_SHAPES = 2048
EXIT_WAIT = 2.0
# Seconds the thread gathers events before posting them: one request per second at
# most from a training process, however many graphs it resolves meanwhile.
LINGER = 1.0
# A counters event alone (no graph to go with) at most this often.
COUNTERS_EVERY = 60.0

# The fields of a run-manifest line a graph event carries (the rest, ``time``,
# ``exit_code``, ``events`` and ``reason_summary``, are the manifest's own; of
# ``fallback``, the event has the kind, the text before its first colon).
GRAPH_FIELDS = (
    "via",
    "key",
    "direct_key",
    "neuron_address",
    "result",
    "source",
    "reason",
    "fetch_seconds",
    "compile_seconds",
    "outcome",
    "saved_seconds",
    "bytes",
    "fallback",
    "compiler_version",
    "pid",
    "host",
)
_SHORT = {"reason": 64, "fallback": 64}  # string bounds other than the server's 255

DMI_PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"
# An EC2 instance type, as Nitro instances name their product (trn1.32xlarge,
# inf2.xlarge, trn2u.48xlarge); a Xen instance says "HVM domU", a laptop its model.
_INSTANCE_TYPE = re.compile(
    r"[a-z][a-z0-9-]{0,15}\.(?:nano|micro|small|medium|large|[0-9]{0,3}xlarge|metal(?:-[0-9]{1,3}xl)?)"
)
_MAX_COUNTERS = 64


# -- who is sending --------------------------------------------------------------------

_detected: dict[str, str | None] = {}


def detect_instance_type(path: str = DMI_PRODUCT_NAME) -> str | None:
    """The EC2 instance type the DMI names, when it names one (no network call: the
    metadata service may be blocked, and a hop costs more than a hit); read once."""
    if path not in _detected:
        try:
            text = Path(path).read_text(errors="replace").strip()
        except OSError:
            text = ""
        _detected[path] = text if _INSTANCE_TYPE.fullmatch(text) else None
    return _detected[path]


def identity(config: ClientConfig, dmi_path: str = DMI_PRODUCT_NAME) -> dict[str, Any]:
    """The fields naming the sender, each left out when unknown."""
    found = {
        "namespace": config.namespace,
        "job_id": config.job_id,
        "host": os.uname().nodename[:255] or None,
        "instance_type": config.instance_type or detect_instance_type(dmi_path),
        "model": config.model,
    }
    return {name: value for name, value in found.items() if value is not None}


# -- events ----------------------------------------------------------------------------


def graph_event(
    config: ClientConfig, line: Mapping[str, Any], at: float, components: Any = None
) -> dict[str, Any]:
    """The ``graph`` event of a run-manifest line (unknown values left out);
    ``components`` (misses) are kept only when they fit the server's bound."""
    event: dict[str, Any] = {"kind": "graph", "at": round(at, 3), **identity(config)}
    for name in GRAPH_FIELDS:
        value = line.get(name)
        if value is None:
            continue
        if name == "fallback" and isinstance(value, str):
            # Its kind alone ("cannot key"): the details after the colon may quote an
            # error naming a file (the run manifest, which stays here, has them).
            value = value.split(":", 1)[0].strip() or "fallback"
        event[name] = _text(value, _SHORT.get(name, 255)) if isinstance(value, str) else value
    if components is not None and line.get("result") == "miss":
        bounded = bounded_components(components)
        if bounded is not None:
            event["components"] = bounded
    return event


def bounded_components(components: Mapping[str, Any]) -> dict[str, Any] | None:
    """``components`` within ``MAX_COMPONENTS_BYTES``: without the graph's shapes,
    then without its summary, if need be; None when even the key's parts are larger."""
    value = dict(components)
    graph = value.get("graph")
    if isinstance(graph, Mapping):
        value["graph"] = dict(graph)
        shapes = graph.get("shapes") or ()
        # The server takes shapes of graphs up to MAX_SHAPES instructions, each a name.
        if (graph.get("instructions") or 0) > MAX_SHAPES or any(len(s) > 255 for s in shapes):
            value["graph"].pop("shapes", None)
    for cut in ("shapes", "graph", None):
        if len(_dumps(value)) <= MAX_COMPONENTS_BYTES:
            return value
        if cut == "shapes" and isinstance(value.get("graph"), dict):
            value["graph"].pop("shapes", None)
        elif cut == "graph":
            value.pop("graph", None)
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _text(value: str, limit: int) -> str:
    """A string as the server takes it: no control characters (a fall-back may quote
    a multi-line error), at most ``limit`` characters."""
    return _CONTROL.sub(" ", value)[:limit]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


# -- the sender ------------------------------------------------------------------------

Queued = tuple[ClientConfig, dict[str, Any]]
Taken = tuple[ClientConfig, dict[str, Any], bytes]  # with its JSON


class Sender:
    """The queue and whoever empties it: a daemon thread (``threaded``), or the
    caller of ``flush``, or a child forked to send it (``detach``: the compiler
    wrapper, whose caller waits for its exit)."""

    def __init__(
        self,
        *,
        threaded: bool = True,
        linger: float = LINGER,
        max_queue: int = MAX_QUEUE,
        reported: Mapping[str, int] | None = None,
    ) -> None:
        self.threaded = threaded
        self._linger = linger
        self._max = max_queue
        self._queue: deque[Queued] = deque()
        self._lock = threading.Lock()  # the queue and the fields below; never held for I/O
        self._cycled = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0  # send cycles begun, and ended: what ``flush`` waits on
        self._ended = 0
        self._in_flight = 0  # events taken from the queue and not yet answered
        self._deadline: float | None = None  # while flushing: every request ends by then
        self._home: ClientConfig | None = None  # where counters go when no graph does
        self._remotes: dict[ClientConfig, Remote] = {}  # used by one thread at a time
        self._refused: set[str] = set()  # servers without /v1/events
        self._warned: set[int] = set()  # the refusals already logged
        # The counters as the server last accepted them (a forked child's: as inherited).
        self._reported: dict[str, int] = dict(reported or {})
        self._counters_at = time.monotonic()

    def enqueue(self, config: ClientConfig, event: dict[str, Any]) -> None:
        """Queue one event for the server of ``config``; returns at once."""
        start = False
        with self._lock:
            if len(self._queue) >= self._max:
                self._queue.popleft()
                STATS.count(ClientCounter.TELEMETRY_DROPPED)
            self._queue.append((config, event))
            self._home = config
            if self.threaded and self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="neffcache-telemetry", daemon=True
                )
                start = True
            full = len(self._queue) >= MAX_BATCH
        if start:
            self._start()
        if full:
            self._wake.set()

    def _start(self) -> None:
        assert self._thread is not None
        try:
            self._thread.start()
        except RuntimeError:  # no thread to be had (a pids limit, interpreter shutdown):
            with self._lock:  # the exit flush then sends inline, rather than wait for none
                self._thread = None
                self.threaded = False

    def pending(self) -> int:
        """Events not yet accepted or dropped: queued, or in a request under way."""
        return len(self._queue) + self._in_flight

    def flush(self, timeout: float | None = None) -> bool:
        """Send what is queued, for at most ``timeout`` seconds; True when the queue
        is empty after. Trouble or a back-off ends it at once: events wait for later."""
        deadline = time.monotonic() + (EXIT_WAIT if timeout is None else timeout)
        if not self.threaded or self._thread is None:
            self._deadline = deadline
            try:
                self._cycle(final=True)
            finally:
                self._deadline = None
            return not self.pending()
        with self._cycled:
            self._deadline = deadline
            target = self._started + 1
            self._wake.set()
            while self._ended < target and time.monotonic() < deadline:
                self._cycled.wait(max(0.0, deadline - time.monotonic()))
            self._deadline = None
            return not self.pending()

    def at_exit(self, timeout: float | None = None) -> None:
        """The last flush: bounded, and what is left is counted as unsent."""
        if self._queue or self._home is not None:
            self.flush(timeout)
        if self.pending():
            STATS.count(ClientCounter.TELEMETRY_UNSENT, self.pending())

    def detach(self, timeout: float | None = None) -> bool:
        """Hand what is queued to a forked child that sends it (``at_exit``) and ends;
        True when it did: this process has nothing left to send.

        For a process whose caller waits for its exit (the compiler wrapper: the SDK
        waits for each compile), so that the server's answer is never waited for. The
        child's standard streams go to /dev/null (a caller reading our output to its
        end does not wait for the child either), and an alarm ends it past the bound,
        whatever it is stuck in (a name lookup has no timeout). Nothing queued, or
        telemetry backed off: no child (False)."""
        wait = EXIT_WAIT if timeout is None else timeout
        with self._lock:
            home = self._queue[0][0] if self._queue else None
        if self._thread is not None or home is None:
            return False  # a thread's queue is not a child's to take
        if not self._remote(home).available(TELEMETRY):
            return False
        global _detaching
        _detaching = True  # the at-fork hook leaves this sender to the child
        try:
            with warnings.catch_warnings():  # 3.12 warns of a fork with threads alive
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            return False
        finally:
            _detaching = False
        if pid == 0:
            self._send_and_end(wait)
        with self._lock:  # the child's now
            self._queue.clear()
            self._home = None
        return True

    def _send_and_end(self, wait: float) -> None:
        """The detached child: at most ``wait`` seconds sending, then gone."""
        try:
            import signal  # here: the wrapper's every hit would pay for its import

            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # its default action ends us
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
            signal.alarm(int(wait) + 2)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            self.at_exit(wait)
        finally:
            os._exit(0)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self._linger)
            self._wake.clear()
            with self._lock:
                self._started += 1
            try:
                self._cycle(final=self._deadline is not None)
            except Exception:  # telemetry's bug must not end telemetry, nor the job
                log.exception("neffcache: sending telemetry failed")
            finally:
                with self._cycled:
                    self._ended += 1
                    self._cycled.notify_all()

    def _cycle(self, final: bool) -> None:
        """Send every queued event, batch by batch; stop at the first trouble. Then a
        counters event alone, when counters rose and none went with a batch. While
        telemetry is backed off nothing is taken or serialized: a cycle then costs a
        look at the back-off, however full the queue."""
        sent_counters = False
        while True:
            with self._lock:
                head = self._queue[0][0] if self._queue else None
            if head is None:
                break
            if head.server not in self._refused and not self._remote(head).available(TELEMETRY):
                STATS.count(ClientCounter.TELEMETRY_SKIPPED)
                return
            batch = self._take()
            if not batch:
                continue  # nothing in it could be sent (not JSON): dropped
            try:
                outcome = self._post(batch[0][0], [data for _, _, data in batch])
            except BaseException:
                self._put_back(batch)
                raise
            if outcome is None:
                self._put_back(batch)
                return
            with self._lock:
                self._in_flight = 0
            sent_counters = sent_counters or outcome
        due = final or time.monotonic() - self._counters_at >= COUNTERS_EVERY
        if not sent_counters and due and self._home is not None and self._news():
            self._post(self._home, [])

    def _take(self) -> list[Taken]:
        """The oldest events for one server, each with its JSON: at most MAX_BATCH,
        within the size bound. Taken under the lock and serialized outside it, so that
        ``enqueue`` (on the training thread) never waits for a batch's JSON."""
        with self._lock:
            taken: list[Queued] = []
            while self._queue and len(taken) < MAX_BATCH:
                if taken and self._queue[0][0] != taken[0][0]:
                    break
                taken.append(self._queue.popleft())
            self._in_flight = len(taken)
        batch: list[Taken] = []
        size = 0
        for i, (config, event) in enumerate(taken):
            try:
                data = _dumps(event)
            except (TypeError, ValueError):  # not JSON (a NaN): the server would refuse
                STATS.count(ClientCounter.TELEMETRY_REJECTED)
                continue
            if batch and size + len(data) > MAX_BATCH_BYTES - 16 * 1024:
                # Room kept for the counters event; the rest go in the next batch.
                self._put_back([(c, e, b"") for c, e in taken[i:]])
                break
            batch.append((config, event, data))
            size += len(data) + 1
        with self._lock:
            self._in_flight = len(batch)
        return batch

    def _put_back(self, batch: list[Taken]) -> None:
        with self._lock:
            self._in_flight = 0
            self._queue.extendleft((config, event) for config, event, _ in reversed(batch))
            while len(self._queue) > self._max:
                self._queue.popleft()
                STATS.count(ClientCounter.TELEMETRY_DROPPED)

    def _post(self, config: ClientConfig, events: list[bytes]) -> bool | None:
        """Post ``events`` (each as JSON) with a counters event when counters rose:
        True when that went, False when not (or the batch was refused), None on
        trouble (retry)."""
        if config.server in self._refused:
            STATS.count(ClientCounter.TELEMETRY_REJECTED, len(events))
            return False
        snapshot = STATS.snapshot()
        counts = self._rises(snapshot)
        batch = list(events)
        if counts:
            counters = {"kind": "counters", "at": round(time.time(), 3), **identity(config)}
            batch.append(_dumps({**counters, "counts": counts}))
        if not batch:
            return False
        timeout = None
        if self._deadline is not None:
            timeout = min(config.timeout, self._deadline - time.monotonic())
            if timeout <= 0:
                return None
        body = b'{"events":[' + b",".join(batch) + b"]}"
        status = self._remote(config).events(body, timeout=timeout)
        if status is None:
            return None
        # Accepted or refused, these counts are settled: a refused batch is not sent
        # again, lest a counters event the server cannot take go with every flush.
        self._reported.update({name: snapshot[name] for name in counts})
        self._counters_at = time.monotonic()
        if 200 <= status < 300:
            STATS.count(ClientCounter.TELEMETRY_SENT, len(events))
            return bool(counts)
        STATS.count(ClientCounter.TELEMETRY_REJECTED, len(events))
        if status in (404, 405):
            self._refused.add(config.server)  # a server older than telemetry
        if status not in self._warned:  # once per answer: a bad token refuses every batch
            self._warned.add(status)
            log.warning(
                "neffcache: the server refused %d telemetry event(s): HTTP %d", len(batch), status
            )
        return False

    def _rises(self, snapshot: Mapping[str, int]) -> dict[str, int]:
        """How much each counter rose since the server last accepted it (at most 64
        names, in name order; the rest go next time)."""
        rises = {
            name: value - self._reported.get(name, 0)
            for name, value in sorted(snapshot.items())
            if is_counter_name(name) and value > self._reported.get(name, 0)
        }
        return dict(list(rises.items())[:_MAX_COUNTERS])

    def _news(self) -> bool:
        """Whether a counter other than telemetry's own rose: worth a request alone
        (telemetry's own would make every send the cause of the next)."""
        return any(not name.startswith("telemetry_") for name in self._rises(STATS.snapshot()))

    def _remote(self, config: ClientConfig) -> Remote:
        remote = self._remotes.get(config)
        if remote is None:
            from neffcache.client.remote import Remote

            remote = self._remotes[config] = Remote(config)
        return remote


# -- the process's sender --------------------------------------------------------------

_sender: list[Sender] = []
_sender_lock = threading.Lock()
_detaching = False  # while ``Sender.detach`` forks: its child keeps the sender
_inherited: dict[str, int] = {}  # a forked child's counters at the fork (its parent's)


def sender(*, threaded: bool = True) -> Sender:
    """This process's sender, made on first use; ``threaded`` decides its kind then
    (the compiler wrapper asks for one without a thread before it queues anything)."""
    with _sender_lock:
        if not _sender:
            made = Sender(threaded=threaded, reported=_inherited)
            _sender.append(made)
            atexit.register(made.at_exit)
        return _sender[0]


def send(config: ClientConfig, event: dict[str, Any]) -> None:
    """Queue ``event`` for ``config``'s server, unless telemetry is off."""
    if config.telemetry:
        sender().enqueue(config, event)


def forget_sender() -> None:
    """Drop this process's sender and what it queued, as if the process were new (the
    hit daemon, before each request: a declined request's events are the shim's to
    send, and a served one's go with ``finish(detach=True)``)."""
    with _sender_lock:
        for made in _sender:
            atexit.unregister(made.at_exit)
            for remote in made._remotes.values():
                remote.close()
        _sender.clear()


def finish(timeout: float | None = None, *, detach: bool = False) -> None:
    """Flush this process's sender now, boundedly (``EXIT_WAIT``). ``detach``: from a
    forked child, so that this process can exit at once (the compiler wrapper, whose
    caller waits for its exit: a hit must not wait for the server's answer)."""
    with _sender_lock:
        made = _sender[0] if _sender else None
    if made is None or (detach and made.detach(timeout)):
        return
    made.at_exit(timeout)


def _after_fork_in_child() -> None:
    # A forked child (a ProcessPoolExecutor worker of neuron_parallel_compile) has no
    # thread, and maybe a lock held by a thread that is gone (the sender's takes the
    # counters' lock every second): it starts afresh, its counters from the fork on.
    global _sender_lock, _inherited
    _sender_lock = threading.Lock()  # the counters' lock is reset by stats.py's hook
    if _detaching:
        return  # Sender.detach's child: it sends its parent's events and counters
    _inherited = STATS.snapshot()
    for inherited in _sender:  # the parent sends these; its exit hook is still ours
        inherited._queue.clear()
        inherited._home = None
        inherited._in_flight = 0
    _sender.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
