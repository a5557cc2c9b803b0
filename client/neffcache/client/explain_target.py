"""What a user hands ``neffcache explain``, turned into the key to explain.

Users meet graphs by their stock address: the SDK's logs print it, the stock cache
directory is named by it, and a run manifest's hook lines name a miss by it alone. The
server explains keys. So :func:`resolve_target` takes:

* a 64-hex key: itself;
* a stock address in any spelling the SDK prints: ``neuronxcc-<ver>/MODULE_<k>+<f8>``,
  ``MODULE_<k>+<f8>`` without its version folder, either followed by a file of the
  entry (``.../model.neff``), a path into a stock cache directory on another host, the
  compiler's work file ``model.MODULE_<k>+<f8>.hlo_module.pb``, or a whole log line
  naming one of these;
* a path on this host: a stock entry (its folder, or a file in it: L1's, where the hook
  keeps them, or a stock cache's), or one of L1's manifests
  (``.neffcache/keys/ab/<key>.json``).

A stock entry on this host is keyed as the hook keys it (``proxy.entry_inputs``, then
``keys.canonical_key``: one computation for both). An address whose entry is not here
is looked up where the client records addresses beside keys: L1's manifests and the
run manifest (``NEFFCACHE_RUN_MANIFEST``). Not on the server: its one lookup by
address, ``GET .../aliases/{address}``, counts as a use of the entry (a hit, a later
eviction), which asking why never is; its telemetry is found by key only.

Everything read here (entries, manifests, run-manifest lines) may have been written by
anything on the host: checked before use, and a bad one is a reason in the message,
never a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, NamedTuple

from neffcache.client.cli._common import CommandError
from neffcache.client.config import DEFAULT_LOCAL_DIR, SCHEME_PREFIX, location, sdk_urls
from neffcache.client.manifests import BadManifest, check, is_digest
from neffcache.keying import STOCK_FLAGS_NAMES, STOCK_HLO_NAMES, KeyingError, parse_neuron_address

_KEY = re.compile(r"[0-9a-fA-F]{64}")
_MODULE = re.compile(r"MODULE_[0-9A-Za-z]{1,128}\+[0-9a-f]{8}")
# An address inside any text: the version folder is optional, and what follows the
# flags hash must not continue it (``.hlo_module.pb`` and ``/model.neff`` do not).
_ADDRESS_IN = re.compile(
    r"(?:(?P<version>neuronxcc-[^/\s]+)/)?(?P<module>MODULE_[0-9A-Za-z]{1,128}\+[0-9a-f]{8})"
    r"(?![0-9A-Za-z])"
)
# L1's manifests are a few KiB; a larger file under their name is not one.
_MANIFEST_MAX = 1 << 20
_HLO_FILE_HINT = (
    "explain the entry's HLO module instead: neffcache explain HLO_FILE "
    "--compiler-version V --target T -- FLAG ..."
)


class Wanted(NamedTuple):
    """A stock address as asked for: its version folder may be unknown."""

    version_dir: str | None  # "neuronxcc-<version>"
    module: str  # "MODULE_<key>+<flags8>"

    def __str__(self) -> str:
        return f"{self.version_dir}/{self.module}" if self.version_dir else self.module

    def matches(self, address: str) -> bool:
        if self.version_dir:
            return address == str(self)
        return address.endswith("/" + self.module)


class Found(NamedTuple):
    """A key for the address, and where it came from (for a choice between several)."""

    key: str
    address: str
    where: str


def resolve_target(text: str, environ: Mapping[str, str]) -> str | None:
    """The key ``neffcache explain`` asks about for ``text`` (see the module docstring);
    None when ``text`` is none of those forms: a file to read as an HLO module, which
    the command keys with its compile options (and says so if it cannot read it).

    ``environ`` is the job's environment: its L1 (``NEFFCACHE_LOCAL_DIR``), the SDK's
    cache settings, its run manifest, and the compile-affecting variables a key covers.
    CommandError, one line, when the text names a graph whose key cannot be found (it
    says where it looked), or several lines, one per key, when more than one matches."""
    what = text.strip()
    if _KEY.fullmatch(what) and not os.path.exists(what):
        return what.lower()
    path = os.path.expanduser(what)
    if what and os.path.exists(path):
        return _from_path(Path(os.path.abspath(path)), environ)
    wanted = _address_in(what)
    if wanted is None:
        return None
    return _by_address(wanted, environ)


def _address_in(text: str) -> Wanted | None:
    """The last stock address in ``text``; CommandError for a malformed version."""
    found = list(_ADDRESS_IN.finditer(text))
    if not found:
        return None
    version, module = found[-1]["version"], found[-1]["module"]
    if version:
        try:
            parse_neuron_address(f"{version}/{module}")
        except KeyingError as exc:
            raise CommandError(str(exc)) from None
    return Wanted(version, module)


# --- a path on this host


def _from_path(path: Path, environ: Mapping[str, str]) -> str | None:
    if ".neffcache" in path.parts:
        return _from_l1_record(path)
    entry = path if path.is_dir() else path.parent
    if not _MODULE.fullmatch(entry.name):
        if path.is_dir():
            raise CommandError(
                f"{path} is a directory but not a stock cache entry "
                "(neuronxcc-<version>/MODULE_<key>+<flags8>)"
            )
        return None  # a file outside any entry: an HLO module
    wanted = Wanted(_version_dir(entry), entry.name)
    keyed = _key_entry(entry, wanted, environ)
    if isinstance(keyed, Found):
        return keyed.key
    looked = [keyed]
    return _one(wanted, _recorded(wanted, environ, looked), looked)


def _version_dir(entry: Path) -> str | None:
    """The entry's version folder, when it names a compiler version."""
    try:
        parse_neuron_address(f"{entry.parent.name}/{entry.name}")
    except KeyingError:
        return None
    return entry.parent.name


def _open_regular(path: Path | str) -> BinaryIO:
    """``path`` opened for reading when it is a regular file; OSError otherwise. Opened
    without blocking: a FIFO planted under a file's name would hang ``open``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return os.fdopen(fd, "rb")


def _from_l1_record(path: Path) -> str:
    """The key of one of L1's manifests; CommandError for anything else of L1's."""
    parts = path.parts[path.parts.index(".neffcache") + 1 :]
    stem = path.name.removesuffix(".json")
    shaped = (
        len(parts) == 3
        and parts[0] == "keys"
        and path.name.endswith(".json")
        and is_digest(stem)
        and parts[1] == stem[:2]
    )
    if not shaped:
        blob = parts[:1] == ("blobs",)
        what = (
            "a blob of L1 (a file's bytes, named by their digest)"
            if blob
            else "part of L1's own store"
        )
        raise CommandError(
            f"{path} is {what}, not a graph: name one of L1's manifests "
            "(.neffcache/keys/ab/<key>.json), a stock entry or a stock address"
        )
    manifest = _read_manifest(path)
    key = manifest.get("key")
    if not is_digest(key):
        raise CommandError(f"{path} names no key")
    if stem not in (key, manifest.get("direct_key")):
        raise CommandError(f"{path} holds the manifest of another key ({key}): not L1's record")
    return str(key)


def _read_manifest(path: Path) -> dict[str, object]:
    try:
        with _open_regular(path) as f:
            data = f.read(_MANIFEST_MAX + 1)
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > _MANIFEST_MAX:
        raise CommandError(f"{path} is not a manifest: larger than 1 MiB")
    try:
        return check(json.loads(data))
    except BadManifest as exc:
        raise CommandError(f"{path} is not a usable manifest: {exc}") from None
    except (ValueError, RecursionError):
        raise CommandError(f"{path} is not a manifest: not JSON") from None


# --- a stock entry, keyed as the hook keys it


def _key_entry(entry: Path, wanted: Wanted, environ: Mapping[str, str]) -> Found | str:
    """The entry's key, or why it has none (a sentence naming the entry)."""
    if wanted.version_dir is None:
        return f"{entry} cannot be keyed: its folder names no compiler (neuronxcc-<version>)"
    from neffcache.client.keys import canonical_key
    from neffcache.client.proxy import entry_inputs

    address = str(wanted)
    inputs = entry_inputs(entry, address, dict(environ))
    if inputs is None:
        return f"{entry} cannot be keyed: {_unkeyable(entry)}"
    try:
        key = canonical_key(*inputs).key
    except ValueError as exc:  # KeyingError: not a module keying can read
        return f"{entry} cannot be keyed: {exc}"
    return Found(key, address, f"computed from {entry}")


def _unkeyable(entry: Path) -> str:
    """Why ``entry_inputs`` found no inputs in ``entry``."""
    from neffcache.client.proxy import stock_flags

    if not any((entry / name).is_file() for name in STOCK_HLO_NAMES):
        return f"it holds no HLO module ({' or '.join(STOCK_HLO_NAMES)})"
    if not any((entry / name).is_file() for name in STOCK_FLAGS_NAMES):
        return f"it holds no flags file ({' or '.join(STOCK_FLAGS_NAMES)})"
    read = stock_flags(entry)
    if read is None:
        return "its flags file cannot be read"
    if read.target is None:
        return "no --target in its flags file, nor NEURON_PLATFORM_TARGET_OVERRIDE"
    return "its HLO module cannot be read"


def _by_address(wanted: Wanted, environ: Mapping[str, str]) -> str:
    """The key of an address: from its entries on this host, else from the records."""
    found: list[Found] = []
    looked: list[str] = []
    for root in _stock_roots(environ):
        entries = _entries_under(Path(root), wanted)
        if not entries:
            looked.append(f"no entry under {root}")
        for entry in entries:
            keyed = _key_entry(entry, Wanted(_version_dir(entry), entry.name), environ)
            if isinstance(keyed, Found):
                found.append(keyed)
            else:
                looked.append(keyed)
    return _one(wanted, found or _recorded(wanted, environ, looked), looked)


def _stock_roots(environ: Mapping[str, str]) -> list[str]:
    """L1 (where the hook keeps its stock entries), then every stock cache directory
    the SDK's settings name."""
    roots: list[str] = []
    for url in (environ.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR, *sdk_urls(environ)):
        if SCHEME_PREFIX in url or "://" in url.removeprefix("file://"):
            continue  # the server, or S3: no directory here
        where = location(url)
        if where and where not in roots:
            roots.append(where)
    return roots


def _entries_under(root: Path, wanted: Wanted) -> list[Path]:
    if wanted.version_dir:
        versions = [wanted.version_dir]
    else:
        try:
            versions = sorted(n for n in os.listdir(root) if n.startswith("neuronxcc-"))
        except OSError:
            return []
    return [root / v / wanted.module for v in versions if (root / v / wanted.module).is_dir()]


# --- where the client records addresses beside keys


def _recorded(wanted: Wanted, environ: Mapping[str, str], looked: list[str]) -> list[Found]:
    """Keys recorded for the address in L1's manifests and the run manifest; what was
    looked at is added to ``looked``."""
    l1 = Path(location(environ.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR))
    found = _in_l1_manifests(wanted, l1 / ".neffcache" / "keys")
    if not found:
        looked.append(f"none of L1's manifests under {l1 / '.neffcache' / 'keys'} names it")
    path = environ.get("NEFFCACHE_RUN_MANIFEST")
    if not path:
        looked.append("no run manifest (NEFFCACHE_RUN_MANIFEST is unset)")
        return found
    in_run, said = _in_run_manifest(wanted, path)
    if not in_run:
        looked.append(said)
    return found + in_run


def _in_l1_manifests(wanted: Wanted, keys_dir: Path) -> list[Found]:
    found: list[Found] = []
    needle = wanted.module.encode()
    for path in sorted(keys_dir.glob("*/*.json")):
        try:
            with _open_regular(path) as f:
                data = f.read(_MANIFEST_MAX + 1)
            if len(data) > _MANIFEST_MAX or needle not in data:  # most: no parse
                continue
            manifest = check(json.loads(data))
        except (OSError, ValueError, RecursionError):
            continue  # unreadable or malformed: not a record of anything
        address, key = manifest.get("neuron_address"), manifest.get("key")
        if isinstance(address, str) and wanted.matches(address) and is_digest(key):
            found.append(Found(str(key), address, f"L1's manifest {path}"))
    return found


def _in_run_manifest(wanted: Wanted, path: str) -> tuple[list[Found], str]:
    """The keys of the run manifest's lines naming the address, and what was seen when
    none did."""
    from neffcache.client.prewarm import record_ids

    found: list[Found] = []
    keyless = 0
    needle = wanted.module.encode()
    try:
        with _open_regular(path) as f:
            for number, raw in enumerate(f, 1):
                if needle not in raw:  # most lines: no parse
                    continue
                record = _parsed(raw)
                ids = dict(record_ids(record) or ())
                address = ids.get("neuron_address")
                if address is None or not wanted.matches(address):
                    continue
                key = ids.get("key") or _explain_key(record)
                if key is not None:
                    found.append(Found(key, address, f"the run manifest {path}, line {number}"))
                else:
                    keyless += 1
    except OSError as exc:
        return [], f"cannot read the run manifest {path}: {exc.strerror}"
    if keyless:
        return found, (
            f"the run manifest {path} names it on {keyless} line(s), none with a key "
            "(the hook's lines for L1 hits carry the stock address alone)"
        )
    return found, f"no line of the run manifest {path} names it"


def _parsed(raw: bytes) -> object:
    """One run-manifest line, parsed; None when it is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def _explain_key(record: object) -> str | None:
    """A hook miss line's ``explain_key`` (runlog.py), when it is a well-formed key."""
    key = record.get("explain_key") if isinstance(record, dict) else None
    return key if isinstance(key, str) and is_digest(key) else None


def _one(wanted: Wanted, found: list[Found], looked: list[str]) -> str:
    first: dict[str, Found] = {}
    for item in found:
        first.setdefault(item.key, item)
    if len(first) == 1:
        return next(iter(first))
    if not first:
        raise CommandError(f"no key found for {wanted}: {'; '.join(looked)}; {_HLO_FILE_HINT}")
    lines = [f"{wanted} matches {len(first)} keys; explain one of them:"]
    lines += [f"  {item.key}  {item.address}  ({item.where})" for item in first.values()]
    raise CommandError("\n".join(lines))
