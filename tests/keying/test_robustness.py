"""fingerprint_hlo on hostile input: only KeyingError, and the same answer everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neffcache.keying import KeyingError, fingerprint_hlo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
SEEDS = [
    (FIXTURES / f"{name}.pb").read_bytes()
    for name in ("block_a", "allreduce_groups_pair", "attrs_ab", "block_scheduled", "torch_block")
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "splice"]))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
        else:  # a run of another fixture's bytes: well-formed fields in the wrong place
            other = draw(st.sampled_from(SEEDS))
            start = draw(st.integers(0, len(other) - 1))
            data[at:at] = other[start : start + draw(st.integers(1, 32))]
        if not data:
            break
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated())
def test_mutated_modules_give_a_fingerprint_or_a_keying_error(data: bytes) -> None:
    try:
        digest = fingerprint_hlo(data)
    except KeyingError as exc:
        message = str(exc)
        digest = None
    if digest is None:
        assert message.startswith(("not an HLO module", "expected the bytes"))
    else:
        assert len(digest) == 64
        assert fingerprint_hlo(data) == digest


def test_the_same_bytes_give_the_same_fingerprint_in_another_process() -> None:
    # The canonical form's boundary marks are random per process; they must never
    # reach the fingerprint.
    path = FIXTURES / "block_a.pb"
    code = (
        "import sys; from neffcache.keying import fingerprint_hlo; "
        "print(fingerprint_hlo(open(sys.argv[1], 'rb').read()))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        for _ in range(2)
    }
    assert outputs == {fingerprint_hlo(path.read_bytes())}
