"""The stock Neuron cache's entry folder (docs/neuron-sdk.md#entry-layout and
#entry-states): its file names, and which files are a compile's artifacts, and the three
eras of the layout. The client (which reads and writes entries in L1) and the server's
bridge (which imports and exports stock caches) share these rules."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import NamedTuple

from ._errors import KeyingError
from ._flags import flags_target, neuron_cache_flags, neuron_flags_hash, split_flags

STOCK_NEFF = "model.neff"
STOCK_DONE = "model.done"  # 0 bytes: the entry is complete
STOCK_LOG = "model.log"  # a failed compile's log
STOCK_FLAGS = "compile_flags.json"
# The oldest era's flags file: the raw flags string (docs/neuron-sdk.md#layout-eras).
STOCK_FLAGS_TXT = "compile_flags.txt"
STOCK_FLAGS_NAMES = (STOCK_FLAGS, STOCK_FLAGS_TXT)
# The HLO's name changed across SDK versions (docs/neuron-sdk.md#entry-layout): the
# newer name first.
STOCK_HLO_NAMES = ("model.hlo_module.pb", "model.hlo.pb")
STOCK_LOCK_SUFFIX = ".lock"
# Markers of an entry's state, never artifacts of a compile.
_MARKERS = frozenset({STOCK_DONE, STOCK_LOG})


def is_stock_artifact(name: str) -> bool:
    """Whether a file of an entry belongs in its manifest, and may be written into an
    entry from one: not a state marker, not a lock (a manifest naming one would make
    the SDK wait for a compile nobody runs), not hidden (temporary files), not a path."""
    return (
        bool(name)
        and name not in _MARKERS
        and not name.endswith(STOCK_LOCK_SUFFIX)
        and not name.startswith(".")
        and "/" not in name
        and "\0" not in name
    )


class StockEra(enum.Enum):
    """Which libneuronxla wrote a stock entry (docs/neuron-sdk.md#layout-eras): its
    flags file, that file's content, the formula of the ``<flags8>`` in its address, and
    whether ``model.done`` marks it complete. The era follows libneuronxla, not the
    compiler: 2.14.227 folders exist in both of the first two.

    ========  ======================  ===============================  ==========
    era       flags file              ``<flags8>``                     model.done
    ========  ======================  ===============================  ==========
    RAW       compile_flags.txt       ``md5(raw string)[:8]``          no
    JSON      compile_flags.json      ``md5(json.dumps(list))[:8]``    yes
    TARGET    compile_flags.json      the same, ``--target`` first     yes
    ========  ======================  ===============================  ==========

    >>> StockEra.TARGET.flags_hash(StockEra.TARGET.flags_list("", "trn1"))
    'e30acd3a'
    """

    # compiler <= 2.14: the SDK probed model.neff itself (docs/neuron-sdk.md#hit-detection)
    RAW = "raw"
    JSON = "json"  # 2.14.227 and 2.15
    TARGET = "target"  # 2.16 on, transformers-neuronx included

    @property
    def flags_file(self) -> str:
        return STOCK_FLAGS_TXT if self is StockEra.RAW else STOCK_FLAGS

    @property
    def marks_done(self) -> bool:
        """Whether the SDK of this era writes ``model.done`` (and looks for it)."""
        return self is not StockEra.RAW

    def flags_list(self, flags: str | Sequence[str], target: str | None) -> list[str]:
        """The tokens this era writes and hashes for a compile of ``flags`` for
        ``target``: wrapper-only flags removed in every era
        (docs/neuron-sdk.md#flags-hash item 4), and ``--target=<target>`` prepended only
        from TARGET on."""
        return neuron_cache_flags(flags, target if self is StockEra.TARGET else None)

    def flags_hash(self, flags: str | Sequence[str]) -> str:
        """``<flags8>`` of this era's tokens (``flags_list``); a string is RAW's raw
        flags string, hashed exactly as given."""
        if self is StockEra.RAW:
            return neuron_flags_hash(flags, legacy=True)
        return neuron_flags_hash(split_flags(flags) if isinstance(flags, str) else flags)

    def flags_content(self, flags: Sequence[str]) -> bytes:
        """The flags file of this era holding the tokens ``flags``."""
        if self is StockEra.RAW:
            return " ".join(flags).encode()
        return json.dumps(list(flags)).encode()


class StockFlags(NamedTuple):
    """A flags file as read: its era, its tokens, and the text its era hashes."""

    era: StockEra
    flags: list[str]
    preimage: str

    @property
    def target(self) -> str | None:
        return flags_target(self.flags)

    @property
    def flags_hash(self) -> str:
        """``md5`` of the file's text: every era hashes exactly what it wrote."""
        return neuron_flags_hash(self.preimage, legacy=True)


def read_stock_flags(name: str, data: bytes) -> StockFlags:
    """Read an entry's flags file: ``compile_flags.txt`` is RAW; a JSON list of
    strings is TARGET when it names a ``--target`` (``--target=trn2``, or NxDI's two
    words) and JSON otherwise. KeyingError for another name or content."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise KeyingError(f"{name} is not UTF-8") from None
    if name == STOCK_FLAGS_TXT:
        return StockFlags(StockEra.RAW, split_flags(text), text)
    if name != STOCK_FLAGS:
        raise KeyingError(f"{name!r} is not a stock flags file ({', '.join(STOCK_FLAGS_NAMES)})")
    try:
        flags = json.loads(text)
    except ValueError:
        raise KeyingError(f"{STOCK_FLAGS} is not JSON") from None
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise KeyingError(f"{STOCK_FLAGS} is not a JSON list of strings")
    era = StockEra.TARGET if flags_target(flags) is not None else StockEra.JSON
    return StockFlags(era, flags, text)


def stock_era_of(flags_hash: str, flags: Sequence[str], target: str | None) -> StockEra | None:
    """The era whose ``<flags8>`` for a compile of ``flags`` (tokens as the compiler
    got them, without the options the SDK adds per call) for ``target`` is
    ``flags_hash``, newest first; None when no era's is. The RAW string is taken to
    be the tokens joined by single spaces, the only spelling a command line keeps."""
    for era in (StockEra.TARGET, StockEra.JSON, StockEra.RAW):
        if era.flags_hash(era.flags_list(flags, target)) == flags_hash:
            return era
    return None
