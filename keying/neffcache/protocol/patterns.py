"""What a name or a digest on the wire may look like: one spelling for both sides.

Each pattern is a raw string, unanchored, because pydantic's ``Field(pattern=...)``
and FastAPI's path parameters take strings (``f"^{HEX64}$"``), and the server splices
some into larger patterns. Python code matches through ``matches``/``is_*``, which
compile a pattern on its first use: the client's shim imports this module once per
graph, and compiling every pattern at import would cost it about a millisecond for
patterns most processes never use.
"""

from __future__ import annotations

import functools
import re
from typing import TypeGuard

# A BLAKE3 digest in lowercase hex: a cache key, a direct key, a blob's address. The
# case is fixed so that one digest has one spelling in a URL, a file name and the index.
HEX64 = r"[0-9a-f]{64}"
# A namespace: a path segment and a Prometheus label value, so no slash, no upper case
# (two spellings of one team's cache would split it), at most 63 characters.
NAMESPACE = r"[a-z0-9][a-z0-9._-]{0,62}"
# A file name inside an entry, as the stock layout has them: no directory, no "." or
# "..", no leading dot (the SDK's lock files), so that it is safe as a path component.
FILE_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"
# A neuronx-cc build string, such as 2.20.9961.0+0acef03a.
COMPILER_VERSION = r"[0-9]+(?:\.[0-9]+)+\+[0-9A-Za-z]+"
# A stock Neuron cache address, neuronxcc-<version>/MODULE_<module key>+<flags hash>
# (docs/neuron-sdk.md#module_key): the module key is the SDK's, so only its alphabet is
# known.
NEURON_ADDRESS = rf"neuronxcc-{COMPILER_VERSION}/MODULE_[0-9A-Za-z]{{1,128}}\+[0-9a-f]{{8}}"
# A name an alias or a compile lease may have (docs/protocol.md: a direct key, or a
# stock address neuronxcc-<ver>/MODULE_<key>+<8 hex>). The routes that take one, and
# pins of an address, accept any version spelling, looser than NEURON_ADDRESS (which a
# manifest's own ``neuron_address`` meets): a stock cache's folders are named by
# whatever SDK wrote them, and a name once taken keeps being one.
ALIAS = rf"(?:{HEX64}|neuronxcc-[0-9][0-9A-Za-z.+]*/MODULE_[0-9A-Za-z]{{1,128}}\+[0-9a-f]{{8}})"
# A job's model label (NEFFCACHE_MODEL): printable, since reports and tables print it.
MODEL_LABEL = r"[^\x00-\x1f\x7f]+"
MODEL_LABEL_MAX = 200
# A client counter's name in a counters event: a Prometheus label value the server may
# use as is.
COUNTER_NAME = r"[a-z0-9_]{1,64}"
# A compile lease's id: known only to its holder, 128 random bits in hex.
LEASE_ID = r"[0-9a-f]{32}"


@functools.cache
def compiled(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled once per process, on first use."""
    return re.compile(pattern)


def matches(pattern: str, value: object) -> TypeGuard[str]:
    """Whether ``value`` is a string that ``pattern`` matches whole."""
    return isinstance(value, str) and compiled(pattern).fullmatch(value) is not None


def is_hex64(value: object) -> TypeGuard[str]:
    return matches(HEX64, value)


def is_namespace(value: object) -> TypeGuard[str]:
    return matches(NAMESPACE, value)


def is_file_name(value: object) -> TypeGuard[str]:
    return matches(FILE_NAME, value)


def is_neuron_address(value: object) -> TypeGuard[str]:
    return matches(NEURON_ADDRESS, value)


def is_alias(value: object) -> TypeGuard[str]:
    return matches(ALIAS, value)


def is_counter_name(value: object) -> TypeGuard[str]:
    return matches(COUNTER_NAME, value)
