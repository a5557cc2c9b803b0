"""The documented primitives ``DurableIndex`` writes its roles over
(recovery/documented.py): a write through the primitive itself, not only through a
role, leaves the row's document what the primitive holds; maps that hold no durable
rows get no documents; a refused write of an equal row (a retry) puts back a missing
document. The whole ``Catalogs`` contract also runs over the documented catalogs
(tests/contract/test_catalogs.py), and the roles' behaviour over them in test_durable.py.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from support.indexes import KEY, OTHER_KEY, entry

from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.eviction.pins import PIN
from neffcache.server.index import Record, Token
from neffcache.server.index.base import entry_facts
from neffcache.server.index.records import record_field, records_map
from neffcache.server.index.tokens import TOKENS, token_value
from neffcache.server.namespaces import POLICY
from neffcache.server.recovery import documents as docs
from neffcache.server.recovery.durable import DurableIndex

NS = "team-a"
MANIFEST = '{"neff":"11"}'


@pytest.fixture
def durable(documented_index: DurableIndex) -> DurableIndex:
    return documented_index


def documents_of(durable: DurableIndex) -> dict[str, bytes]:
    store = durable.store
    return {name: store.get_document(name) or b"" for name in store.documents("")}


def test_a_row_put_through_the_catalogs_has_its_document_until_deleted(
    durable: DurableIndex,
) -> None:
    row = entry(manifest=MANIFEST)
    assert durable.catalogs.put_new(row, entry_facts(MANIFEST), ("an-alias",)) is None
    name = docs.entry_name(NS, KEY)
    assert docs.entry_from(documents_of(durable)[name]) == row

    assert durable.catalogs.claim(NS, "named", KEY) == (True, KEY)
    alias = documents_of(durable)[docs.alias_name(NS, "named")]
    assert docs.alias_from(alias) == (NS, "named", KEY)
    assert durable.catalogs.claim(NS, "nothing", OTHER_KEY) is None  # no row: no name
    assert docs.alias_name(NS, "nothing") not in documents_of(durable)

    assert durable.catalogs.delete_if(NS, KEY, row.created_at)
    assert name not in documents_of(durable)


def test_a_retried_put_of_the_same_row_puts_back_its_missing_document(
    durable: DurableIndex,
) -> None:
    row = entry(manifest=MANIFEST)
    durable.catalogs.put_new(row, entry_facts(MANIFEST), ())
    name = docs.entry_name(NS, KEY)
    durable.store.delete_document(name)  # as if the first try died between the two
    assert durable.catalogs.put_new(row, entry_facts(MANIFEST), ()) == row
    assert docs.entry_from(documents_of(durable)[name]) == row

    other = entry(manifest='{"neff":"22"}', writer="t2")
    durable.store.delete_document(name)
    assert durable.catalogs.put_new(other, entry_facts(other.manifest), ()) == row
    assert name not in documents_of(durable)  # a conflicting put writes nothing


def test_a_durable_record_written_through_its_map_follows_each_write(
    durable: DurableIndex,
) -> None:
    where, field = records_map(POLICY), record_field(NS, "expiry")
    name = docs.record_name(POLICY, NS, "expiry")
    assert durable.maps.put_new(where, field, '{"days":7}')
    assert docs.record_from(documents_of(durable)[name]) == Record(
        POLICY, NS, "expiry", '{"days":7}'
    )
    assert durable.maps.swap(where, field, '{"days":7}', '{"days":9}')
    assert docs.record_from(documents_of(durable)[name]).value == '{"days":9}'
    assert not durable.maps.swap(where, field, '{"days":7}', '{"days":1}')
    assert docs.record_from(documents_of(durable)[name]).value == '{"days":9}'
    assert durable.maps.delete_if(where, field, '{"days":9}')
    assert name not in documents_of(durable)


def test_maps_without_durable_rows_get_no_documents(durable: DurableIndex) -> None:
    durable.maps.put_new("m", "f", "one")
    durable.maps.swap("m", "f", "one", "two")
    durable.put_record(Record("meta", "", "complete", "{}"))
    durable.put_record(Record("removed", NS, KEY, "1.0"))
    assert documents_of(durable) == {}
    durable.put_record(Record(PIN, NS, KEY, "{}"))
    assert list(documents_of(durable)) == [docs.record_name(PIN, NS, KEY)]


def test_a_token_put_through_the_map_has_its_document_and_a_revocation_stands(
    durable: DurableIndex,
) -> None:
    token = Token("id1", "h" * 64, "admin", (), "ops", 1_712_000_000.5)
    assert durable.maps.put_new(TOKENS, token.secret_hash, token_value(token))
    name = docs.token_name("id1")
    assert docs.token_from(documents_of(durable)[name]) == token

    # A document that says revoked (the index restored from an older backup) wins over
    # a row that does not: the row is revoked too.
    revoked = Token("id1", "h" * 64, "admin", (), "ops", 1_712_000_000.5, revoked=True)
    durable.store.put_document(name, docs.token_document(revoked))
    durable.maps.put_new(TOKENS, token.secret_hash, token_value(token))  # a retry
    assert json.loads(durable.maps.get(TOKENS, token.secret_hash) or "")["revoked"] is True
    assert docs.token_from(documents_of(durable)[name]).revoked


def test_documents_come_from_the_wrapper_and_a_rewrite_puts_a_missing_one_back() -> None:
    """The same writes on the plain index leave the store empty, so nothing above is
    the backend's doing; a record put again unchanged through the wrapper (an admin's
    retry after a failed document write) is documented."""
    from neffcache.server.index.memory import MemoryIndex

    plain, store = MemoryIndex(), MemoryBlobStore()
    with contextlib.closing(store):
        plain.put_entry(entry(manifest=MANIFEST), ())
        plain.put_record(Record(POLICY, NS, "expiry", "{}"))
        assert list(store.documents("")) == []
        wrapped = DurableIndex(plain, store)
        wrapped.put_record(Record(POLICY, NS, "expiry", "{}"))
        assert list(store.documents("")) == [docs.record_name(POLICY, NS, "expiry")]
