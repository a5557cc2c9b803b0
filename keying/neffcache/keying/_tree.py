"""The digest of a directory the compiler takes as its input.

``torch_neuronx.trace`` hands ``neuronx-cc`` a folder, not a file: the graph
(``graph.hlo``), its ``metadata.json`` and the weights beside it (``weights/*.npy``).
The compiler reads all of it, so all of it is in the digest: each file's path relative
to the folder and a label of its content. The caller chooses the labels: the raw
bytes' digest for the direct key (``"blake3:<hex>"``), and for the canonical key the
graph's canonical fingerprint in place of its bytes (``"hlo:<fingerprint>"``), so a
re-trace under other names still hits while other weights never do.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import KeyingError
from ._hasher import TaggedHasher
from ._version import KEY_VERSION

_DOMAIN = f"neffcache {KEY_VERSION} input directory"


def tree_digest(files: Iterable[tuple[str, str]]) -> str:
    """64 hex digits over ``(relative path, content label)`` pairs, in any order.

    Paths are POSIX, relative, without ``.`` or ``..`` parts, and unique; labels are
    any text. A folder's empty subfolders are not in it (the compiler reads files).

    >>> tree_digest([("graph.hlo", "blake3:00"), ("weights/w.npy", "blake3:01")])[:16]
    '4aef1d5b19c519de'
    """
    pairs = sorted(files)
    hasher = TaggedHasher(_DOMAIN)
    hasher.field("files", str(len(pairs)))
    seen: set[str] = set()
    for path, label in pairs:
        _check_path(path)
        if path in seen:
            raise KeyingError(f"the directory lists {path!r} twice")
        seen.add(path)
        hasher.field("path", path)
        hasher.field("content", label)
    return hasher.hexdigest()


def _check_path(path: object) -> None:
    if not isinstance(path, str) or not path or path.startswith("/"):
        raise KeyingError(f"{path!r} is not a relative path")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise KeyingError(f"{path!r} is not a normalized relative path")
