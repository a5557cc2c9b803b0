"""Whether this process may write to an L1: declared read-only
(``NEFFCACHE_LOCAL_READ_ONLY``) or a directory it cannot write (docs/client.md, "A
read-only L1").

Below ``local.py`` (which re-exports ``l1_read_only``), ``l1limit.py`` and
``hoststats.py``, which all ask it, so that none of them imports another for it.
Standard library only: the shim asks on every graph.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# L1 directories declared read-only in this process (absolute paths). local.py's
# writers refuse to write below them as a read-only filesystem does (EROFS), so every
# best-effort writer (down marks, the compiler's version memo, failure notes) goes on
# exactly as it does on a read-only mount: a declared L1 and an unwritable one behave
# the same.
_DECLARED_READ_ONLY: set[str] = set()
_ACCESS_AS_EFFECTIVE = os.access in os.supports_effective_ids


def forget_declared() -> None:
    """Forget the L1s declared read-only so far, as a new process knows none (the hit
    daemon, before each request: another caller's declaration is not this one's)."""
    _DECLARED_READ_ONLY.clear()


def l1_read_only(local_dir: str | Path, declared: bool) -> bool:
    """Whether neffcache must not write to the L1 at ``local_dir``: ``declared`` so
    (``NEFFCACHE_LOCAL_READ_ONLY``), or a directory this process cannot write (a
    read-only mount, another user's files: asked of the kernel with ``access``, so root
    writes wherever it may). An L1 that does not exist yet is made here, as its first
    write would make it; one that cannot be made is read-only (and empty)."""
    top = os.path.abspath(local_dir)
    if declared:
        _DECLARED_READ_ONLY.add(top)
        return True
    return not _writable(top)


def _writable(top: str) -> bool:
    seen = False
    for path in (os.path.join(top, ".neffcache"), top):
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        seen = True
        if not os.access(path, os.W_OK | os.X_OK, effective_ids=_ACCESS_AS_EFFECTIVE):
            return False
    if seen:
        return True
    try:
        os.makedirs(top, exist_ok=True)
    except OSError:
        return False
    return os.access(top, os.W_OK | os.X_OK, effective_ids=_ACCESS_AS_EFFECTIVE)


def refuse_if_read_only(directory: str | Path) -> None:
    """OSError (EROFS) when ``directory`` lies in an L1 declared read-only."""
    if not _DECLARED_READ_ONLY:
        return
    here = os.path.abspath(directory)
    for top in _DECLARED_READ_ONLY:
        if here == top or here.startswith(top + os.sep):
            raise OSError(errno.EROFS, "L1 is read-only (NEFFCACHE_LOCAL_READ_ONLY)", here)
