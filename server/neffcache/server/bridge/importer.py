"""``neffcache import``: every successful entry of a stock cache becomes a server entry.

An entry is keyed as the client keys what the SDK compiles (client ``proxy.py``): the
canonical key of its HLO under the compiler version of its folder, the target of the
``--target=`` flag in ``compile_flags.json`` (else the one given to the command) and
those flags, with no environment (a stock cache records none). Its Neuron address and
direct key become aliases.

Nothing is half-imported: the blobs the server lacks go first, then the manifest,
which the server publishes atomically only when every blob is there. An entry the
server already holds is counted ``present`` before anything is read beyond its HLO and
flags, so a second run uploads nothing.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from neffcache.keying import (
    CacheKey,
    CompileContext,
    KeyingError,
    KeyInputs,
    compute_key,
    direct_key,
    fingerprint_hlo,
    normalize_flags,
    parse_neuron_address,
)
from neffcache.server.bridge.remote import Refused, Remote
from neffcache.server.bridge.report import Progress, Report
from neffcache.server.bridge.stock import (
    FLAGS,
    HLO_NAMES,
    ReadError,
    State,
    StockEntry,
    StockSource,
)

DONE_OUTCOMES = ("imported", "present", "conflict")
SKIPPED = ("failed", "locked", "empty", "incomplete", "unkeyable")
# The server's pattern for a file name in a manifest (docs/protocol.md).
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


class Unkeyable(Exception):
    """An entry that cannot be keyed or stored as it is; the message says why."""


@dataclass(frozen=True)
class Keyed:
    address: str
    canonical: CacheKey
    direct: CacheKey


def import_cache(
    source: StockSource, remote: Remote, *, target: str | None, progress: Progress
) -> Report:
    """Import every entry of ``source``; per-entry trouble is counted, while an
    unusable server or source raises (``Unusable``, ``SourceError``)."""
    report = Report("import", DONE_OUTCOMES, SKIPPED)
    entries = source.entries()
    progress.total = len(entries)
    for entry in entries:
        outcome, reason = import_entry(source, remote, entry, target)
        report.add(outcome, entry.address, reason)
        progress.advance(f"{outcome} {entry.address}")
    return report


def import_entry(
    source: StockSource, remote: Remote, entry: StockEntry, target: str | None
) -> tuple[str, str | None]:
    """The outcome of importing one entry, and why when it is noteworthy."""
    if entry.state is not State.SUCCESS:
        return entry.state.value, None
    with tempfile.TemporaryDirectory(prefix="neffcache-import-") as scratch:
        try:
            keyed = key_entry(source, entry, target, Path(scratch))
            if remote.entry(keyed.canonical.key) is not None:
                return "present", None
            files = {
                name: source.local_file(entry, name, Path(scratch)) for name in entry.artifacts()
            }
            manifest, paths = make_manifest(keyed, files)
            return publish(remote, manifest, paths)
        except Unkeyable as exc:
            return "unkeyable", str(exc)
        except (ReadError, OSError) as exc:
            return "error", f"cannot read the entry: {exc}"
        except Refused as exc:
            return "error", str(exc)


def key_entry(source: StockSource, entry: StockEntry, target: str | None, scratch: Path) -> Keyed:
    """The keys of an entry from its folder name, flags file and HLO; Unkeyable."""
    try:
        address = str(parse_neuron_address(entry.address))
    except KeyingError as exc:
        raise Unkeyable(str(exc)) from None
    bad = [name for name in entry.artifacts() if not _FILE_NAME.fullmatch(name)]
    if bad:
        raise Unkeyable(f"file name {bad[0]!r} cannot be stored (letters, digits, ._+- only)")
    if FLAGS not in entry.sizes:
        raise Unkeyable(f"no {FLAGS}")
    hlo = next((name for name in HLO_NAMES if name in entry.sizes), None)
    if hlo is None:
        raise Unkeyable(f"no {' or '.join(HLO_NAMES)}")
    flags = read_flags(source.local_file(entry, FLAGS, scratch).read_bytes())
    module = source.local_file(entry, hlo, scratch).read_bytes()
    version = address.split("/")[0].removeprefix("neuronxcc-")
    return Keyed(address, *keys(module, version, flags, target))


def read_flags(raw: bytes) -> list[str]:
    """``compile_flags.json``: a JSON list of strings (facts §3.1, §4.3)."""
    try:
        flags = json.loads(raw)
    except ValueError:
        raise Unkeyable(f"{FLAGS} is not JSON") from None
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise Unkeyable(f"{FLAGS} is not a JSON list of strings")
    return flags


def keys(
    module: bytes, version: str, flags: list[str], target: str | None
) -> tuple[CacheKey, CacheKey]:
    """The canonical and direct keys; the flags' own ``--target`` wins over ``target``."""
    try:
        named = [f.partition("=")[2] for f in normalize_flags(flags) if f.startswith("--target=")]
        chosen = named[-1] if named else target
        if not chosen:
            raise Unkeyable(f"no --target in {FLAGS}; pass --target to say which")
        ctx = CompileContext.create(compiler_version=version, target=chosen, flags=flags, env={})
        return compute_key(KeyInputs(fingerprint_hlo(module), ctx)), direct_key(module, ctx)
    except KeyingError as exc:
        raise Unkeyable(str(exc)) from None


def make_manifest(keyed: Keyed, files: dict[str, Path]) -> tuple[dict[str, Any], dict[str, Path]]:
    """The manifest, shaped as the client's (``publish.make_manifest``) without the
    compile time nobody measured, and the local file behind each digest."""
    refs: dict[str, dict[str, Any]] = {}
    paths: dict[str, Path] = {}
    for name, path in sorted(files.items()):
        digest = file_digest(path)
        refs[name] = {"digest": digest, "size": path.stat().st_size}
        paths[digest] = path
    manifest = {
        "key": keyed.canonical.key,
        "direct_key": keyed.direct.key,
        "neuron_address": keyed.address,
        "components": keyed.canonical.as_json(),
        "files": refs,
    }
    return manifest, paths


def file_digest(path: Path) -> str:
    hasher = blake3.blake3()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def publish(
    remote: Remote, manifest: dict[str, Any], paths: dict[str, Path]
) -> tuple[str, str | None]:
    """Blobs the server lacks, then the manifest; once more if a blob vanished in
    between (eviction). Refused when the server does not take them."""
    key = manifest["key"]
    for _attempt in (0, 1):
        for digest in remote.missing(sorted(paths)):
            remote.put_blob(digest, paths[digest], paths[digest].stat().st_size)
        try:
            status = remote.put_entry(key, manifest)
        except Refused as exc:
            if isinstance(exc.body, dict) and exc.body.get("missing"):
                continue
            raise
        if status == 409:
            return "conflict", f"the server holds another manifest under key {key}"
        return ("imported" if status == 201 else "present"), None
    return "error", f"the server lost blobs of {key} twice while it was published"
