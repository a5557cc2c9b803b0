"""Who may write a namespace, beyond the token's scope: its policy's trusted-writers
rule (``check_writer``, services/publish.py). Every route that changes what a
namespace's readers receive or wait for (entries, aliases, failure records, leases)
checks it."""

from __future__ import annotations

from neffcache.server.auth import Caller
from neffcache.server.deps import Backends
from neffcache.server.namespaces import NamespacePolicy
from neffcache.server.services.publish import check_writer


async def policy_of(backends: Backends, namespace: str) -> NamespacePolicy:
    return await backends.run(backends.policies.get, namespace)


async def require_writer(backends: Backends, caller: Caller, namespace: str) -> NamespacePolicy:
    """The namespace's policy, once the caller is known to be allowed to write it: a
    first check, before the request's body is read (write routes check again with
    ``check_writer`` right before the index write, so a body sent slowly cannot carry
    a write past a change of the rule)."""
    caller.require("write", namespace)
    return await backends.run(check_writer, backends, caller, namespace)
