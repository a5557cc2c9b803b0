"""The report's ``storage``: entries, bytes and quota of each namespace, from the
app's usage memo (``eviction/usage.py``, shared with the metrics' gauges)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from neffcache.server.eviction.usage import UsageMemo
from neffcache.server.namespaces import Policies


def storage_rows(
    memo: UsageMemo, policies: Policies, namespaces: Sequence[str]
) -> list[dict[str, Any]]:
    found = []
    for namespace in sorted(set(namespaces)):
        held = memo.usage(namespace)
        found.append(
            {
                "namespace": namespace,
                "entries": held.entries,
                "bytes": held.bytes,
                "quota_bytes": policies.get(namespace).quota_bytes,
            }
        )
    return found
