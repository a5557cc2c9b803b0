"""Every backend provides every role (index/roles.py) with the protocol's signatures,
and ``Index`` is exactly the roles plus ``check`` and ``close``."""

from __future__ import annotations

import inspect

import pytest

from neffcache.server.index import roles
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SqliteIndex

ROLES = [
    roles.Entries,
    roles.Failures,
    roles.Leases,
    roles.Tokens,
    roles.Records,
    roles.AuditLog,
    roles.EventLog,
]


def members(protocol: type) -> set[str]:
    return {
        name
        for name in vars(protocol)
        if not name.startswith("_") and callable(vars(protocol)[name])
    }


@pytest.mark.parametrize(
    "backend", [MemoryIndex, SqliteIndex, RedisIndex], ids=lambda b: b.__name__
)
@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_backend_has_the_roles_methods_with_its_parameters(backend: type, role: type) -> None:
    for name in members(role):
        wanted = inspect.signature(getattr(role, name))
        found = inspect.signature(getattr(backend, name))
        assert list(found.parameters) == list(wanted.parameters), (backend, name)


def test_no_method_is_in_two_roles_and_index_adds_only_its_life() -> None:
    seen: set[str] = set()
    for role in ROLES:
        assert not members(role) & seen, role
        seen |= members(role)
    assert members(roles.Index) == {"check", "close"}
