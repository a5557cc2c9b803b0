"""An entry as GET answers it (``lookup.stamped``): byte for byte what json.dumps of
the manifest's stamps spliced into it gave, whatever the stamps hold."""

from __future__ import annotations

import json

import pytest

from neffcache.server.index import Entry
from neffcache.server.lookup import stamped

MANIFEST = json.dumps({"files": {}, "key": "a" * 64}, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("created_at", [1.5, 1764662400.123456, 3.0, 0.1 + 0.2, 1e21, 7])
@pytest.mark.parametrize("writer", ["anonymous", "tok_1a2b", 'caf\u00e9 "quoted" \\ \u2603'])
def test_stamped_is_what_json_dumps_splices(created_at: float, writer: str) -> None:
    entry = Entry("team-a", "a" * 64, MANIFEST, created_at, writer)
    stamps = json.dumps({"created_at": created_at, "namespace": "team-a", "writer": writer})
    assert stamped(entry) == MANIFEST[:-1] + "," + stamps[1:]
    assert json.loads(stamped(entry))["writer"] == writer
