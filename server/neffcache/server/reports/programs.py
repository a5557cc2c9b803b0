"""Which graph an entry holds, apart from the toolchain that compiled it: how the
upgrade report tells that a graph in use is built under the new compiler already.

An entry's key is a digest of its components: the program (``fingerprint``), the
compiler version, the target, the flags, the environment, the frameworks and the key
version. Two entries hold the same graph for another compiler when every component
but the toolchain is equal, which ``program_of`` tests exactly: it recomputes the key
with the compiler version (and the frameworks) set to one constant, in the spelling
keys use (``keying.compute_key``). Not the fingerprint alone (the same program under
other flags or for another target is another key), and never the graph's summary
(``graph_summary`` erases shapes: a graph of other shapes would match).

The frameworks (the standalone NKI package) are left out with the compiler: a Neuron
SDK release ships both, so the entries a prewarm publishes under the new compiler
carry the new NKI, as the upgraded jobs will, and the graph in use the old one.
"""

from __future__ import annotations

import json

from neffcache.server.explain.request import key_of

# A compiler version no build has (keying checks the form of a build string): the
# program's digest is a key of this version, never compared with a real key.
ANY_COMPILER = "0.0+toolchain"


def program_of(key: str, manifest: str | None) -> bytes | None:
    """The digest of the graph an entry holds apart from its toolchain; None when its
    manifest (untrusted: what a client published) has no components that make its
    key (none, incomplete, another key version, a client's bug): no match is claimed
    for a graph whose components cannot be checked."""
    if manifest is None:
        return None
    try:
        raw = json.loads(manifest)
    except ValueError:
        return None
    components = raw.get("components") if isinstance(raw, dict) else None
    if not isinstance(components, dict) or key_of(components) != key:
        return None
    program = key_of({**components, "compiler_version": ANY_COMPILER, "frameworks": {}})
    return None if program is None else bytes.fromhex(program)
