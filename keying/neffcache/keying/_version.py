"""The version of the key derivation.

KEY_VERSION is the first field of every cache key and the domain of every HLO
fingerprint. Bump it whenever the same inputs would produce different bytes to hash:
a change to canonicalization (what is dropped, renumbered or kept), to flag or
environment normalization, to the field order or encoding of the key. Never reuse a
value. Old entries then simply stop matching, which costs compiles but can never serve
a NEFF built from different inputs (ccache HASH_PREFIX, sccache CACHE_VERSION).
The golden-digest tests (tests/keying/test_key.py, tests/keying/test_fingerprint.py)
fail on any such change, as a reminder to bump it.
"""

from __future__ import annotations

KEY_VERSION = "1"
