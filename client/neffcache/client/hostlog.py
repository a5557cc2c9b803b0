"""The host's counter log in L1 as both its writer (``hoststats.py``, on every graph)
and its folder (``hosttally.py``) read it: where it lives and what a record holds
(the record's format is in ``hoststats.py``'s docstring).

A module of its own, below both, so that neither imports the other for these: the
writer imports the folder (to fold a long log), never the other way round. Standard
library only: the writer runs in every compiler process.
"""

from __future__ import annotations

import os

VERSION = "1"
# Persisted ids: never renamed.
KINDS = ("l1", "server", "compiled", "failed", "replayed")
DIRECTORY = os.path.join(".neffcache", "stats")
LOG = "log"
# Past this the log is not appended to: folding has failed for many thousands of graphs
# (an L1 whose locks cannot be made), and L1 is for NEFFs, not for counters.
CAP = 16 << 20
# Bounds of a record's figures, as the folder reads them back.
MAX_SECONDS = 7 * 86400.0
MAX_BYTES = 1 << 50
_CODE_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def stats_dir(local_dir: str) -> str:
    return os.path.join(local_dir, DIRECTORY)


def is_code(text: str) -> bool:
    """A reason code as the server's vocabulary spells them (``new-graph``)."""
    return 0 < len(text) <= 64 and text[0] != "-" and _CODE_CHARACTERS.issuperset(text)
