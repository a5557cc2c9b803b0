"""docs/explain.md cannot drift from the code: every reason code is in its table."""

from __future__ import annotations

from pathlib import Path

from neffcache.server.explain.reasons import CLIENT_REASONS, REASONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "explain.md"


def test_every_reason_the_server_gives_has_a_row_and_the_client_ones_are_named() -> None:
    doc = DOC.read_text()
    server = set(REASONS) - CLIENT_REASONS | {"unknown"}
    assert sorted(code for code in server if f"| `{code}` |" not in doc) == []
    assert sorted(code for code in CLIENT_REASONS if f"`{code}`" not in doc) == []
