"""``neffcache export``: a server's entries written out as a stock Neuron cache.

Each entry with a Neuron address becomes ``DEST/<address>/`` holding every file of its
manifest, each verified against its BLAKE3 digest, and an empty ``model.done`` written
last (docs/neuron-sdk.md#entry-layout and #hit-detection): the unmodified SDK reads it as
a cache hit. An entry from the oldest era of the layout (``stock_era`` ``raw``, or a
``compile_flags.txt`` among its files; docs/neuron-sdk.md#layout-eras) gets no
``model.done``, as its SDK wrote none.

Every Neuron address that is an alias of the entry (another trace of the same program,
found by ``neffcache import`` or by a client) gets its own folder too, the same files
hard-linked to the entry's first folder written in this run where the filesystem
allows, else copied: an SDK pointed at the export hits every graph the source cache
held. An entry is written into a hidden folder beside its place and renamed into it,
so an interrupted export leaves no half entry (only a hidden ``.MODULE_…partial``
folder, which the SDK never looks at, and an interrupted process removes even that).
A complete entry already in DEST is left alone. An entry without ``model.neff`` is an
error: written out, the SDK would take it for a hit and fail to load it.

Beside the outcomes (one per entry) the report counts ``folders_written`` (every
folder, aliases included), ``alias_folders`` (those of aliases) and ``hard_links``
(files linked rather than downloaded or copied).

DEST also gets the cache-wide ``lock`` (empty, mode 0666): the SDK opens it for
writing even to look up (docs/neuron-sdk.md#cache-wide-lock), so a user who cannot
create files in DEST can still use it, if not a read-only mount.

Skipped, and counted by reason:

* ``no_address``: compiled where no stock address was known; the SDK could not find
  it in any folder.
* ``env``: compiled under a compile-affecting environment variable
  (``components.env``). A stock address does not cover the environment, so the SDK
  would serve that NEFF to processes without the variable.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from neffcache.client.bridge.remote import Refused, Remote
from neffcache.client.bridge.report import Progress, Report
from neffcache.keying import (
    STOCK_DONE,
    STOCK_FLAGS_TXT,
    STOCK_NEFF,
    KeyingError,
    StockEra,
    is_stock_artifact,
    parse_neuron_address,
)
from neffcache.protocol import Manifest, parse

DONE_OUTCOMES = ("exported", "present")
SKIPPED = ("filtered", "no_address", "env", "occupied")
# The SDK's cache-wide lock file (docs/neuron-sdk.md#cache-wide-lock).
LOCK = "lock"
# Counted beside the outcomes.
FOLDERS = "folders_written"
ALIAS_FOLDERS = "alias_folders"
LINKS = "hard_links"


@dataclass
class Written:
    """What exporting entries wrote: folders, those of aliases, files hard-linked."""

    folders: int = 0
    alias_folders: int = 0
    links: int = 0


@dataclass(frozen=True)
class Filters:
    """Which entries to export: by compiler version (the full build string, or its
    number alone for every build of it) and by the server's ``created_at``."""

    compiler_version: str | None = None
    since: float | None = None

    def keep(self, manifest: dict[str, Any]) -> bool:
        """Whether to export ``manifest``; ValueError for a ``created_at`` that is not
        a time."""
        created_at = manifest.get("created_at", 0.0)
        if not isinstance(created_at, (int, float)) or not math.isfinite(created_at):
            raise ValueError(f"created_at {str(created_at)[:40]!r}")
        if self.since is not None and created_at < self.since:
            return False
        wanted = self.compiler_version
        if wanted is None:
            return True
        components = manifest.get("components")
        version = components.get("compiler_version") if isinstance(components, dict) else None
        if not isinstance(version, str):
            return False
        return version == wanted or ("+" not in wanted and version.split("+")[0] == wanted)


def parse_since(text: str) -> float:
    """``YYYY-MM-DD`` (midnight) or a full ISO 8601 time, UTC unless it names a zone,
    as seconds since the epoch; ValueError otherwise."""
    value = text.strip()
    if value[-1:] in ("Z", "z"):  # Python 3.10's fromisoformat does not read "Z"
        value = value[:-1] + "+00:00"
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def export_report() -> Report:
    return Report("export", DONE_OUTCOMES, SKIPPED, tallies=(FOLDERS, ALIAS_FOLDERS, LINKS))


def export_cache(
    remote: Remote,
    dest: Path,
    *,
    filters: Filters,
    progress: Progress,
    report: Report | None = None,
) -> Report:
    """Export every entry the filters keep into ``report`` (a new one by default: pass
    one to keep the counts of a run that raises); per-entry trouble is counted, while an
    unusable server raises ``Unusable`` and an unwritable DEST ``OSError``."""
    report = export_report() if report is None else report
    dest.mkdir(parents=True, exist_ok=True)
    write_lock(dest)
    for page in remote.pages():
        for manifest in page:
            address = str(manifest.get("neuron_address") or manifest.get("key"))
            written = Written()
            outcome, reason = export_entry(remote, dest, manifest, filters, written)
            report.add(outcome, address, reason)
            report.tally(FOLDERS, written.folders)
            report.tally(ALIAS_FOLDERS, written.alias_folders)
            report.tally(LINKS, written.links)
            progress.advance(f"{outcome} {address}")
    return report


def export_entry(
    remote: Remote,
    dest: Path,
    manifest: dict[str, Any],
    filters: Filters,
    written: Written | None = None,
) -> tuple[str, str | None]:
    """The outcome of exporting one entry (every folder of it), and why when it is
    noteworthy; what it wrote is added to ``written``."""
    try:
        if not filters.keep(manifest):
            return "filtered", None
        entry = parse(manifest)  # ManifestError, a ValueError, names the bad field
        addresses = stock_addresses(remote, entry)
        if not addresses:
            return "no_address", None
        if entry.components.get("env"):
            return "env", None
        files = stock_files(entry)
        era = stock_era(entry, files)
    except (KeyingError, ValueError) as exc:
        return "error", f"the server sent an entry that cannot be exported: {exc}"
    except Refused as exc:
        return "error", str(exc)
    if STOCK_NEFF not in files:
        return "error", f"no {STOCK_NEFF}: the SDK would take the folder for a hit it cannot load"
    return export_folders(remote, [dest / a for a in addresses], files, era, written or Written())


def export_folders(
    remote: Remote,
    places: list[Path],
    files: dict[str, tuple[str, int]],
    era: StockEra,
    written: Written,
) -> tuple[str, str | None]:
    """Write one entry's folder at each of ``places`` (its own address first): the
    first written downloads the files, the others link to it. The entry's outcome is
    its first folder's, ``exported`` when any folder was, ``error`` when any failed."""
    outcomes: list[tuple[str, str | None]] = []
    source: Path | None = None
    for i, place in enumerate(places):
        outcome = export_folder(remote, place, files, era, source, written)
        if outcome[0] == "exported":
            written.folders += 1
            if i > 0:
                written.alias_folders += 1
            source = source or place
        outcomes.append(outcome)
    failed = [o for o in outcomes if o[0] == "error"]
    if failed:
        return failed[0]
    if any(o[0] == "exported" for o in outcomes):
        return "exported", None
    return outcomes[0]


def export_folder(
    remote: Remote,
    place: Path,
    files: dict[str, tuple[str, int]],
    era: StockEra,
    source: Path | None,
    written: Written,
) -> tuple[str, str | None]:
    """The outcome of writing one folder, from the server or linked to ``source``."""
    try:
        _refuse_a_link(place.parent)
    except Refused as exc:
        return "error", str(exc)
    if complete(place, era):
        return "present", None
    if place.exists():
        # Not ours to replace: a stock entry of another state, or a compile running.
        return "occupied", None
    try:
        written.links += write_entry(remote, place, files, era=era, source=source)
    except Refused as exc:
        return "error", str(exc)
    except FileExistsError:
        return "present", None  # another export wrote it meanwhile
    return "exported", None


def _refuse_a_link(folder: Path) -> None:
    """Refused when the compiler-version folder in DEST is a symbolic link (or not a
    folder): DEST may sit in a directory others can write (the SDK's default is under
    /var/tmp), and a planted link would have this export write wherever it points.
    Replacing it is not ours to do: it may be the user's own arrangement."""
    try:
        found = folder.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(found.st_mode):
        raise Refused(
            f"{folder} is a symbolic link (to {os.readlink(folder)}): refusing to write "
            "through it; remove it, or export to a DEST that holds the folder itself"
        )
    if not stat.S_ISDIR(found.st_mode):
        raise Refused(f"{folder} is not a folder")


def stock_addresses(remote: Remote, entry: Manifest) -> list[str]:
    """The entry's own Neuron address, then every other alias of it that is one, in
    the server's order. An alias that is not one is skipped (no SDK could look it up)."""
    found = [str(parse_neuron_address(entry.neuron_address))] if entry.neuron_address else []
    for alias in remote.aliases(entry.key):
        with contextlib.suppress(KeyingError):
            address = str(parse_neuron_address(alias))
            if address not in found:
                found.append(address)
    return found


def stock_era(entry: Manifest, files: dict[str, tuple[str, int]]) -> StockEra:
    """The layout the entry came from: its ``stock_era``, else what its files say (a
    ``compile_flags.txt`` is the oldest era's). ValueError for an unknown era."""
    named = entry.extra.get("stock_era")
    if named is not None:
        if not isinstance(named, str):
            raise ValueError(f"stock_era {str(named)[:40]!r}")
        return StockEra(named)
    return StockEra.RAW if STOCK_FLAGS_TXT in files else StockEra.TARGET


def complete(place: Path, era: StockEra) -> bool:
    """Whether ``place`` holds an entry the SDK of ``era`` takes for a hit."""
    return (place / (STOCK_DONE if era.marks_done else STOCK_NEFF)).exists()


def stock_files(entry: Manifest) -> dict[str, tuple[str, int]]:
    """The files to write, name -> (digest, size): every file of the manifest but the
    state markers and locks a stock entry must not carry."""
    return {
        name: (ref.digest, ref.size) for name, ref in entry.files.items() if is_stock_artifact(name)
    }


def write_lock(dest: Path) -> None:
    """``DEST/lock``, empty and writable by every user
    (docs/neuron-sdk.md#cache-wide-lock): the SDK opens it for writing on every call,
    lookups included, and would otherwise need to create it, which a user who cannot
    write DEST cannot. An existing one is kept, widened
    if this user owns it; never through a symlink (DEST may sit in /var/tmp)."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(dest / LOCK, flags, 0o666)
    try:
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, 0o666)  # the umask narrowed a new one
    finally:
        os.close(fd)


def write_entry(
    remote: Remote,
    place: Path,
    files: dict[str, tuple[str, int]],
    *,
    era: StockEra = StockEra.TARGET,
    source: Path | None = None,
) -> int:
    """Write the files into a hidden folder beside ``place``, ``model.done`` last
    (when ``era`` has one), then rename it to ``place``. The files come from the
    server, or from the folder ``source`` this export wrote: hard-linked where the
    filesystem allows, else copied. Nothing is left behind on failure. How many files
    were linked."""
    place.parent.mkdir(parents=True, exist_ok=True)
    staging = place.parent / f".{place.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()  # with the umask's permissions, as the SDK's own folders
    links = 0
    try:
        _refuse_a_link(place.parent)  # again: a link planted since the first look
        for name, (digest, size) in sorted(files.items()):
            if source is None:
                remote.fetch_blob(digest, size, staging / name)
            else:
                links += link_or_copy(source / name, staging / name)
        if era.marks_done:
            (staging / STOCK_DONE).touch()
        try:
            os.rename(staging, place)
        except OSError as exc:
            if place.exists():
                raise FileExistsError(str(place)) from exc
            raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
    return links


def link_or_copy(src: Path, dst: Path) -> bool:
    """A hard link at ``dst`` to ``src``, or a copy where links fail (another
    filesystem, one without links, the link limit); True when linked. The folders
    sharing a file are complete entries: no SDK rewrites their files in place."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
        return False
    return True
