"""The stock Neuron cache's entry folder (facts §3.1, §3.2): its file names, and which
files are a compile's artifacts. The client (which reads and writes entries in L1) and
the server's bridge (which imports and exports stock caches) share this one rule."""

from __future__ import annotations

STOCK_NEFF = "model.neff"
STOCK_DONE = "model.done"  # 0 bytes: the entry is complete
STOCK_LOG = "model.log"  # a failed compile's log
STOCK_FLAGS = "compile_flags.json"
# The HLO's name changed across SDK versions (facts §3.1): the newer name first.
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
