"""Entries and their aliases written once over ``Catalogs`` (catalogs.py): an entry is
a row of its namespace's catalog, an alias a name in it. The role derives the facts a
row stores (``entry_facts``), tells SAME from CONFLICT by the row a refused put returns,
and cuts touches into batches; each of its calls is one call of the primitive, so a
lookup stays one backend read and a publish one transaction (one script on Redis).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Entry, EntryStats, PutResult, Touch, entry_facts
from .catalogs import Catalogs

# Touches per primitive call: each call is one transaction (SQLite) or one script,
# which holds Redis for its whole batch.
TOUCH_BATCH = 500


class CatalogEntries:
    """``Entries`` over a backend's catalogs."""

    def __init__(self, catalogs: Catalogs) -> None:
        self._catalogs = catalogs

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        held = self._catalogs.put_new(entry, entry_facts(entry.manifest), aliases)
        if held is None:
            return PutResult.CREATED
        return PutResult.SAME if held.manifest == entry.manifest else PutResult.CONFLICT

    def get_entry(self, namespace: str, key: str) -> Entry | None:
        return self._catalogs.get(namespace, key)

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        return self._catalogs.resolve(namespace, alias)

    def aliases_of(self, namespace: str, key: str) -> list[str]:
        return self._catalogs.names_of(namespace, key)

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        claimed = self._catalogs.claim(namespace, alias, key)
        if claimed is None:
            return None
        written, named = claimed
        if written:
            return PutResult.CREATED
        return PutResult.SAME if named == key else PutResult.CONFLICT

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        return self._catalogs.rows(namespace, after, limit)

    def entry_stats(self, namespace: str, after: str | None, limit: int) -> list[EntryStats]:
        return self._catalogs.stats(namespace, after, limit)

    def touch_entries(self, touches: Sequence[Touch]) -> None:
        for start in range(0, len(touches), TOUCH_BATCH):
            self._catalogs.touch(touches[start : start + TOUCH_BATCH])

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        return self._catalogs.delete_if(namespace, key, created_at)

    def namespaces(self) -> list[str]:
        return self._catalogs.catalogs()
