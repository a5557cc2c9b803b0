"""L1: writable, on a local disk, its size against its limit, and free space."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from neffcache.client.config import ConfigError, _size, local_read_only
from neffcache.client.doctor import words
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.model import Check, Result, failed, passed, skipped, warned
from neffcache.client.doctor.mounts import filesystem_type, is_network
from neffcache.client.l1limit import Evictor, _dirs, _entry_state, _scan
from neffcache.client.manifests import is_digest

# The size walk's budget, as the evictor's own (l1limit.BUDGET): L1 may hold millions
# of files on a host that compiled for months.
WALK_SECONDS = 5.0
# Below this much free space a model's NEFFs (tens of MB to a GB each, hundreds of
# graphs) no longer fit, and the compiler's own work files fail too.
LOW_SPACE = 5 << 30


def writable(ctx: Context) -> Result:
    local = ctx.local_dir()
    kind = filesystem_type(local)
    if local_read_only(ctx.environ):  # never written, not even to try
        return passed(
            f"L1 {local} is declared read-only (NEFFCACHE_LOCAL_READ_ONLY): its entries "
            "are served, nothing is written to it",
            local_dir=local,
        )
    try:
        root = Path(local) / ".neffcache"
        root.mkdir(parents=True, exist_ok=True)
        for directory in (Path(local), root):
            with tempfile.TemporaryFile(dir=directory):
                pass
    except OSError as exc:
        return failed(
            f"L1 {local} is not writable ({exc.strerror or exc}): it is read-only, its "
            "entries served but nothing kept, so ranks share nothing and what compiles is "
            "lost with each process",
            "set NEFFCACHE_LOCAL_DIR to a writable directory on a local disk, owned by the "
            "user every rank runs as",
            local_dir=local,
        )
    if is_network(kind):
        return warned(
            f"L1 {local} is on {kind}, a network filesystem: it is meant to be per host (the "
            "server is the shared tier), and its locks are slow or unreliable there",
            "set NEFFCACHE_LOCAL_DIR to a directory on a local disk (or instance store)",
            local_dir=local,
            filesystem=kind,
        )
    return passed(f"L1 {local} is writable ({kind or 'filesystem unknown'})", local_dir=local)


def _limit(ctx: Context) -> int | None:
    """NEFFCACHE_LOCAL_MAX_SIZE in bytes as the client reads it (None: no limit)."""
    config = ctx.config().config
    try:
        configured = (
            config.local_max_size if config else _size(ctx.environ, "NEFFCACHE_LOCAL_MAX_SIZE")
        )
    except ConfigError:
        configured = None
    return Evictor(ctx.local_dir(), configured).limit()


def used_bytes(local_dir: str, deadline: float) -> tuple[int, bool]:
    """(bytes L1 holds as its limit counts them, whether the walk finished). Read-only:
    the evictor's own walk also removes what a killed evictor left, which only the
    holder of the host's eviction lock may do."""
    total = 0
    top = Path(local_dir)
    for shard in _dirs(top / ".neffcache" / "blobs"):
        if time.monotonic() > deadline:
            return total, False
        for found in _scan(shard):
            if is_digest(found.name):
                try:
                    total += found.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    for version in _dirs(top):
        if not version.name.startswith("neuronxcc-"):
            continue
        for entry in _dirs(version):
            if time.monotonic() > deadline:
                return total, False
            state = _entry_state(entry)
            total += state.size if state is not None else 0
    return total, True


def _used(ctx: Context, local: str) -> tuple[int, bool]:
    return ctx.once(("l1 used", local), lambda: used_bytes(local, time.monotonic() + WALK_SECONDS))


def size(ctx: Context) -> Result:
    local = ctx.local_dir()
    if not os.path.isdir(local):
        return skipped(f"L1 {local} does not exist yet")
    limit = _limit(ctx)
    used, complete = _used(ctx, local)
    held = f"{'' if complete else 'at least '}{words.size(used)}"
    data: dict[str, Any] = {"used_bytes": used, "limit_bytes": limit, "complete": complete}
    if limit is None:
        return passed(f"L1 holds {held}, with no limit (NEFFCACHE_LOCAL_MAX_SIZE=0)", **data)
    if used > limit:
        return warned(
            f"L1 holds {held}, over its {words.size(limit)} limit: the next growth evicts the "
            "least recently used (once per 10 minutes per host), never entries in use",
            "nothing, if it comes down; else raise NEFFCACHE_LOCAL_MAX_SIZE or look for "
            "stock entries an SDK lock keeps",
            **data,
        )
    return passed(f"L1 holds {held} of its {words.size(limit)} limit", **data)


def space(ctx: Context) -> Result:
    local = ctx.local_dir()
    probe = local
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    try:
        fs = os.statvfs(probe)
    except OSError as exc:
        return skipped(f"cannot read the free space of {probe}: {exc.strerror or exc}")
    free = fs.f_bavail * fs.f_frsize
    data: dict[str, Any] = {"free_bytes": free}
    if free < LOW_SPACE:
        return warned(
            f"{words.size(free)} free where L1 is: a model's NEFFs may not fit",
            "free space there, or set NEFFCACHE_LOCAL_DIR to a larger disk",
            **data,
        )
    limit = _limit(ctx)
    used = _used(ctx, local)[0] if os.path.isdir(local) else 0
    if limit is not None and free < limit - used:
        return warned(
            f"{words.size(free)} free where L1 is, less than the {words.size(limit - used)} its "
            "limit still allows: the disk fills before eviction starts",
            f"set NEFFCACHE_LOCAL_MAX_SIZE={max(1, int((used + free * 0.8) / 2**30))}G or less",
            **data,
        )
    return passed(f"{words.size(free)} free where L1 is", **data)


CHECKS = (
    Check("l1.writable", "writable", writable),
    Check("l1.size", "size and limit", size),
    Check("l1.space", "free space", space),
)
