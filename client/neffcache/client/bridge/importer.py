"""``neffcache import``: every successful entry of a stock cache becomes a server entry.

An entry is keyed as the client keys what the SDK compiles (client ``proxy.py``): the
canonical key of its HLO under the compiler version of its folder, the target of the
``--target`` flag in its flags file (else the one given to the command) and those
flags, with no environment (a stock cache records none). Its Neuron address and
direct key become aliases. The flags file is that of any of the three eras of the
layout (docs/neuron-sdk.md#layout-eras: ``compile_flags.txt`` holding the raw string,
or ``compile_flags.json``); the manifest's ``stock_era`` names it, so an export writes
the entry back the same way.

Nothing is half-imported: the blobs the server lacks go first, then the manifest,
which the server publishes atomically only when every blob is there. An entry the
server already holds is counted ``present`` before anything is read beyond its HLO and
flags, so a second run uploads nothing; its address and direct key are still added as
aliases of that entry (another trace of the same program has its own address).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import blake3

from neffcache.client.bridge.remote import Refused, Remote
from neffcache.client.bridge.report import Progress, Report
from neffcache.client.bridge.stock import (
    ReadError,
    State,
    StockEntry,
    StockSource,
)
from neffcache.keying import (
    STOCK_FLAGS_NAMES,
    STOCK_HLO_NAMES,
    CacheKey,
    CompileContext,
    KeyingError,
    KeyInputs,
    StockEra,
    StockFlags,
    compute_key,
    direct_key,
    fingerprint_hlo,
    parse_neuron_address,
    read_stock_flags,
)
from neffcache.protocol import FILE_NAME

DONE_OUTCOMES = ("imported", "present", "conflict")
SKIPPED = ("failed", "locked", "empty", "incomplete", "unkeyable")
# Counted beside the outcomes: aliases added to entries the server already held.
ALIASES_ADDED = "aliases_added"
_CHUNK = 1 << 20


class Unkeyable(Exception):
    """An entry that cannot be keyed or stored as it is; the message says why."""


@dataclass(frozen=True)
class Keyed:
    address: str
    canonical: CacheKey
    direct: CacheKey
    era: StockEra


class Outcome(NamedTuple):
    """What importing one entry came to, why when noteworthy, and how many of its
    aliases were added to an entry the server already held."""

    name: str
    reason: str | None = None
    aliases: int = 0


def import_report() -> Report:
    return Report("import", DONE_OUTCOMES, SKIPPED, tallies=(ALIASES_ADDED,))


def import_cache(
    source: StockSource,
    remote: Remote,
    *,
    target: str | None,
    progress: Progress,
    report: Report | None = None,
) -> Report:
    """Import every entry of ``source`` into ``report`` (a new one by default: pass one
    to keep the counts of a run that raises); per-entry trouble is counted, while an
    unusable server or source raises (``Unusable``, ``SourceError``)."""
    report = import_report() if report is None else report
    entries = source.entries()
    progress.total = len(entries)
    for entry in entries:
        outcome = import_entry(source, remote, entry, target)
        report.add(outcome.name, entry.address, outcome.reason)
        report.tally(ALIASES_ADDED, outcome.aliases)
        progress.advance(f"{outcome.name} {entry.address}")
    return report


def import_entry(
    source: StockSource, remote: Remote, entry: StockEntry, target: str | None
) -> Outcome:
    """The outcome of importing one entry."""
    if entry.problem is not None:
        return Outcome("error", entry.problem)
    if entry.state is not State.SUCCESS:
        return Outcome(entry.state.value)
    with tempfile.TemporaryDirectory(prefix="neffcache-import-") as tmp:
        scratch = Path(tmp)
        try:
            keyed = key_entry(source, entry, target, scratch)
            if remote.entry(keyed.canonical.key) is not None:
                outcome = Outcome("present")
            else:
                files = {n: digest_of(source, entry, n, scratch) for n in entry.artifacts()}
                manifest = make_manifest(keyed, files)
                outcome = publish(
                    remote, manifest, lambda name: source.open_file(entry, name, scratch)
                )
            if outcome.name in ("present", "conflict"):
                # The server's entry came from elsewhere: this folder's names find it too.
                outcome = outcome._replace(aliases=add_aliases(remote, keyed))
            return outcome
        except Unkeyable as exc:
            return Outcome("unkeyable", str(exc))
        except (ReadError, OSError) as exc:
            return Outcome("error", f"cannot read the entry: {exc}")
        except Refused as exc:
            return Outcome("error", str(exc))


def key_entry(source: StockSource, entry: StockEntry, target: str | None, scratch: Path) -> Keyed:
    """The keys of an entry from its folder name, flags file and HLO; Unkeyable."""
    try:
        address = str(parse_neuron_address(entry.address))
    except KeyingError as exc:
        raise Unkeyable(str(exc)) from None
    bad = [name for name in entry.artifacts() if not re.fullmatch(FILE_NAME, name)]
    if bad:
        raise Unkeyable(f"file name {bad[0]!r} cannot be stored (letters, digits, ._+- only)")
    flags_name = next((name for name in STOCK_FLAGS_NAMES if name in entry.sizes), None)
    if flags_name is None:
        raise Unkeyable(f"no {' or '.join(STOCK_FLAGS_NAMES)}")
    hlo = next((name for name in STOCK_HLO_NAMES if name in entry.sizes), None)
    if hlo is None:
        raise Unkeyable(f"no {' or '.join(STOCK_HLO_NAMES)}")
    with source.open_file(entry, flags_name, scratch) as f:
        flags = read_flags(flags_name, f.read())
    with source.open_file(entry, hlo, scratch) as f:
        module = f.read()
    version = address.split("/")[0].removeprefix("neuronxcc-")
    return Keyed(address, *keys(module, version, flags, target), flags.era)


def read_flags(name: str, raw: bytes) -> StockFlags:
    """The flags file ``name`` of any era (docs/neuron-sdk.md#layout-eras); Unkeyable if
    unreadable."""
    try:
        return read_stock_flags(name, raw)
    except KeyingError as exc:
        raise Unkeyable(str(exc)) from None


def keys(
    module: bytes, version: str, flags: StockFlags, target: str | None
) -> tuple[CacheKey, CacheKey]:
    """The canonical and direct keys; the flags' own ``--target`` (``--target=trn2``
    or NxDI's two words) wins over ``target``."""
    try:
        chosen = flags.target or target
        if not chosen:
            raise Unkeyable(f"no --target in {flags.era.flags_file}; pass --target to say which")
        ctx = CompileContext.create(
            compiler_version=version, target=chosen, flags=flags.flags, env={}
        )
        return compute_key(KeyInputs(fingerprint_hlo(module), ctx)), direct_key(module, ctx)
    except KeyingError as exc:
        raise Unkeyable(str(exc)) from None


def digest_of(source: StockSource, entry: StockEntry, name: str, scratch: Path) -> tuple[str, int]:
    """The BLAKE3 digest and size of one file of an entry."""
    hasher = blake3.blake3()
    size = 0
    with source.open_file(entry, name, scratch) as f:
        while chunk := f.read(_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def make_manifest(keyed: Keyed, files: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """The manifest, shaped as the client's (``publish.make_manifest``) without the
    compile time nobody measured; ``files`` maps a name to its digest and size."""
    return {
        "key": keyed.canonical.key,
        "direct_key": keyed.direct.key,
        "neuron_address": keyed.address,
        "components": keyed.canonical.as_json(),
        "stock_era": keyed.era.value,
        "files": {
            name: {"digest": digest, "size": size} for name, (digest, size) in sorted(files.items())
        },
    }


def publish(
    remote: Remote, manifest: dict[str, Any], open_file: Callable[[str], BinaryIO]
) -> Outcome:
    """Blobs the server lacks (each read through ``open_file`` by its name), then the
    manifest; once more if a blob vanished in between (eviction). Refused when the
    server does not take them."""
    key = manifest["key"]
    by_digest = {ref["digest"]: (name, ref["size"]) for name, ref in manifest["files"].items()}
    for _attempt in (0, 1):
        for digest in remote.missing(sorted(by_digest)):
            name, size = by_digest[digest]
            with open_file(name) as f:
                remote.put_blob(digest, f, size)
        try:
            status = remote.put_entry(key, manifest)
        except Refused as exc:
            if isinstance(exc.body, dict) and exc.body.get("missing"):
                continue
            raise
        if status == 409:
            return Outcome("conflict", f"the server holds another manifest under key {key}")
        return Outcome("imported" if status == 201 else "present")
    return Outcome("error", f"the server lost blobs of {key} twice while it was published")


def add_aliases(remote: Remote, keyed: Keyed) -> int:
    """Add the entry's Neuron address and direct key as aliases of the server's entry
    under its key; how many were new (an alias naming another key keeps it)."""
    key = keyed.canonical.key
    return sum(remote.add_alias(alias, key) for alias in (keyed.address, keyed.direct.key))
