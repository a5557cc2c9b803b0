"""The filesystem a path lives on, from ``/proc/mounts`` (Linux; None elsewhere).

L1 belongs on a local disk (it is per host: the server is the shared tier), and a
stack's own cache on a network filesystem is shared across hosts; both are worth
naming, and neither can be seen from the path alone.
"""

from __future__ import annotations

import os

# Filesystems whose files other hosts see (NFS, EFS, FSx for Lustre, SMB, FUSE mounts
# such as s3fs or Mountpoint for Amazon S3).
_NETWORK = ("nfs", "nfs4", "lustre", "cifs", "smb3", "efs", "ceph", "glusterfs", "9p")


def filesystem_type(path: str) -> str | None:
    """The type of the mount holding ``path`` (its nearest existing ancestor)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    try:
        probe = os.path.realpath(probe)
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [line.split()[:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for _, point, kind in mounts:
        point = point.replace("\\040", " ")
        inside = probe == point or probe.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), kind)
    return best[1] if best else None


def is_network(kind: str | None) -> bool:
    if kind is None:
        return False
    # fuse-overlayfs is a rootless container's own root filesystem, not a share.
    return kind in _NETWORK or (kind.startswith("fuse.") and "overlay" not in kind)
