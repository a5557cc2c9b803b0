"""Publishing a compiled graph to the server: blobs the server lacks, then the manifest.

``publish`` does it now (the wrapper, once its compiler has exited). ``Publisher`` does
it on a background thread for the persistent-cache hook, so a training step never
waits for an upload: a bounded queue (a full queue drops the publish and counts it)
and, at interpreter exit, a flush bounded by ``NEFFCACHE_PUBLISH_WAIT``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neffcache.client._log import log
from neffcache.client.local import file_digest
from neffcache.client.manifests import Manifest
from neffcache.client.remote import Remote
from neffcache.client.stats import STATS
from neffcache.keying import CacheKey
from neffcache.protocol.counters import ClientCounter

_QUEUE_SIZE = 256


def make_manifest(
    canonical: CacheKey,
    direct: CacheKey | None,
    address: str | None,
    files: dict[str, Path],
    compile_seconds: float | None,
    model: str | None = None,
) -> tuple[Manifest, dict[str, Path]]:
    """The manifest of an entry and the local file behind each digest it names;
    ``model`` is the job's label (``NEFFCACHE_MODEL``), for pins and reports."""
    refs: dict[str, dict[str, Any]] = {}
    paths: dict[str, Path] = {}
    for name, path in sorted(files.items()):
        digest = file_digest(path)
        refs[name] = {"digest": digest, "size": path.stat().st_size}
        paths[digest] = path
    manifest: Manifest = {
        "key": canonical.key,
        "components": canonical.as_json(),
        "files": refs,
        "host": os.uname().nodename,
    }
    if direct is not None:
        manifest["direct_key"] = direct.key
    if address is not None:
        manifest["neuron_address"] = address
    if compile_seconds is not None:
        manifest["compile_seconds"] = round(compile_seconds, 3)
    if model is not None:
        manifest["model"] = model
    return manifest, paths


def failure_record(
    canonical: CacheKey,
    direct: CacheKey | None,
    address: str | None,
    exit_code: int | None,
    seconds: float | None,
    log_tail: str,
) -> dict[str, Any]:
    """A failure record for ``PUT /v1/ns/{ns}/failures/{key}`` (docs/protocol.md)."""
    record: dict[str, Any] = {
        "compiler_version": canonical.components["compiler_version"],
        "components": canonical.as_json(),
        "log": log_tail[-64 * 1024 :],
        "host": os.uname().nodename,
    }
    if direct is not None:
        record["direct_key"] = direct.key
    if address is not None:
        record["neuron_address"] = address
    if exit_code is not None:
        record["exit_code"] = exit_code
    if seconds is not None:
        record["compile_seconds"] = round(seconds, 3)
    return record


def _named_missing(body: bytes) -> list[str]:
    try:
        value = json.loads(body)
    except ValueError:
        return []
    missing = value.get("missing") if isinstance(value, dict) else None
    return [d for d in missing if isinstance(d, str)] if isinstance(missing, list) else []


def publish(remote: Remote, manifest: Manifest, paths: dict[str, Path]) -> bool:
    """Upload what the server lacks, then the manifest. True once the server holds an
    entry for the key (ours, or an identical or earlier one: entries are immutable)."""
    named: list[str] = []  # blobs the server said it lacks: uploaded whatever a probe says
    for _attempt in (0, 1):
        missing = remote.missing(sorted(paths))
        if missing is None:
            return False
        # A blob being collected still answers present to a probe; the publish's answer
        # names it, and then it is uploaded anyway.
        for digest in dict.fromkeys([*missing, *named]):
            if digest not in paths or not remote.put_blob(digest, paths[digest]):
                STATS.count(ClientCounter.PUBLISH_FAILURES)
                return False
        response = remote.put_entry(manifest["key"], manifest)
        if response is None:
            STATS.count(ClientCounter.PUBLISH_FAILURES)
            return False
        if response.status in (200, 201):
            STATS.count(ClientCounter.PUBLISHES)
            return True
        if response.status == 409:
            # Another host published this key first (the same program, traced with
            # other metadata or stamps): its NEFF serves. This trace's own names must
            # still lead to it, or every later lookup by them misses.
            STATS.count(ClientCounter.PUBLISH_CONFLICTS)
            key = manifest["key"]
            return all(
                remote.put_alias(alias, key)
                for alias in (manifest.get("neuron_address"), manifest.get("direct_key"))
                if isinstance(alias, str)
            )
        if response.status == 400 and b"missing" in response.body:
            # A blob vanished, or was being collected, as the manifest went up: once
            # more, with the blobs the answer names.
            named = [d for d in _named_missing(response.body) if d in paths]
            continue
        STATS.count(ClientCounter.PUBLISH_FAILURES)
        log.warning(
            "neffcache: publishing %s was refused: HTTP %s", manifest["key"], response.status
        )
        return False
    STATS.count(ClientCounter.PUBLISH_FAILURES)
    return False


class Publisher:
    """Runs publish jobs on one daemon thread; ``flush`` waits for them, boundedly."""

    def __init__(self, wait: float) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(_QUEUE_SIZE)
        self._wait = wait
        self._thread = threading.Thread(target=self._run, name="neffcache-publish", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue a job; False when the queue is full and the job was dropped."""
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            STATS.count(ClientCounter.PUBLISHES_DROPPED)
            return False
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job ran; False if ``timeout`` (default: the
        configured wait) ran out first. Jobs left then are dropped with the process."""
        deadline = time.monotonic() + (self._wait if timeout is None else timeout)
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                STATS.count(ClientCounter.PUBLISHES_UNFLUSHED, self._queue.unfinished_tasks)
                log.warning(
                    "neffcache: %d publish(es) still pending at exit; giving up",
                    self._queue.unfinished_tasks,
                )
                return False
            time.sleep(0.02)
        return True

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is not None:
                    job()
            except Exception:  # a publish must never take the thread down
                STATS.count(ClientCounter.PUBLISH_FAILURES)
                log.exception("neffcache: a background publish failed")
            finally:
                self._queue.task_done()
