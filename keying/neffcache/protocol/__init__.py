"""The wire protocol, shared by the client, the server and keying: stdlib only.

One definition of what travels between a client and the server (docs/protocol.md), so
that the two sides cannot drift: the patterns of names and digests (``patterns``),
the entry manifest and its validator (``manifest``), the words of the lease exchange
(``states``) and the API's paths (``routes``). The client's counter names are in
``neffcache.protocol.counters`` and a lookup's file inline in
``neffcache.protocol.inline``, each imported only by those who need it.

It imports nothing outside the standard library (``tests/test_structure.py`` checks),
because the client imports it in every training process and the server's pydantic
models are checked against it (``tests/protocol``), not the other way round.
"""

from __future__ import annotations

from .manifest import (
    FIELDS,
    FILE_REF_FIELDS,
    MAX_FILE_BYTES,
    REQUIRED,
    RESERVED,
    FileRef,
    Manifest,
    ManifestError,
    parse,
)
from .patterns import (
    ALIAS,
    COMPILER_VERSION,
    COUNTER_NAME,
    FILE_NAME,
    HEX64,
    LEASE_ID,
    MODEL_LABEL,
    MODEL_LABEL_MAX,
    NAMESPACE,
    NEURON_ADDRESS,
    compiled,
    is_alias,
    is_counter_name,
    is_file_name,
    is_hex64,
    is_namespace,
    is_neuron_address,
    matches,
)
from .routes import (
    alias_path,
    blob_mismatch_path,
    blob_path,
    entries_path,
    entry_path,
    explain_path,
    failure_path,
    lease_path,
    lease_release_path,
    lease_renew_path,
    namespace_path,
)
from .states import ANSWER_STATES, LEASE_OUTCOMES, AnswerState, LeaseOutcome, is_answer_state

__all__ = [
    "ALIAS",
    "ANSWER_STATES",
    "COMPILER_VERSION",
    "COUNTER_NAME",
    "FIELDS",
    "FILE_NAME",
    "FILE_REF_FIELDS",
    "HEX64",
    "LEASE_ID",
    "LEASE_OUTCOMES",
    "MAX_FILE_BYTES",
    "MODEL_LABEL",
    "MODEL_LABEL_MAX",
    "NAMESPACE",
    "NEURON_ADDRESS",
    "REQUIRED",
    "RESERVED",
    "AnswerState",
    "FileRef",
    "LeaseOutcome",
    "Manifest",
    "ManifestError",
    "alias_path",
    "blob_mismatch_path",
    "blob_path",
    "compiled",
    "entries_path",
    "entry_path",
    "explain_path",
    "failure_path",
    "is_alias",
    "is_answer_state",
    "is_counter_name",
    "is_file_name",
    "is_hex64",
    "is_namespace",
    "is_neuron_address",
    "lease_path",
    "lease_release_path",
    "lease_renew_path",
    "matches",
    "namespace_path",
    "parse",
]
