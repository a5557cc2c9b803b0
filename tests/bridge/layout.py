"""Stock Neuron caches as the SDK writes them (docs/neuron-sdk.md#entry-layout and
#entry-states), built from the real JAX HLO fixtures, and the keys neffcache must give
their entries.

Written from docs/neuron-sdk.md, not from the bridge's code: ``StockCache.add`` lays out
one ``MODULE_`` folder in a given state, and ``expected_key`` keys it with keying's
public functions, as the client keys what the SDK compiles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from neffcache.keying import (
    CompileContext,
    KeyInputs,
    compute_key,
    direct_key,
    fingerprint_hlo,
    neuron_flags_hash,
)

HLO_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
V1 = "2.20.9961.0+0acef03a"
V2 = "2.21.1.0+abcdef12"
# What the SDK's PJRT path hashes (docs/neuron-sdk.md#flags-hash item 5): --target first,
# then user flags.
FLAGS = ["--target=trn1", "--model-type=transformer"]


def hlo(name: str) -> bytes:
    return (HLO_DIR / f"{name}.pb").read_bytes()


@dataclass
class Placed:
    """One entry folder as written: its address and every file's bytes."""

    address: str
    state: str
    files: dict[str, bytes]
    hlo: bytes
    flags: list[str]
    version: str

    def expected_keys(self, target: str | None = None) -> tuple[str, str]:
        """(canonical, direct) as the client computes them for this HLO and flags."""
        named = [f.split("=", 1)[1] for f in self.flags if f.startswith("--target=")]
        ctx = CompileContext.create(
            compiler_version=self.version,
            target=named[0] if named else str(target),
            flags=self.flags,
            env={},
        )
        return compute_key(KeyInputs(fingerprint_hlo(self.hlo), ctx)).key, direct_key(
            self.hlo, ctx
        ).key

    @property
    def artifacts(self) -> dict[str, bytes]:
        """The files a manifest carries: all but model.done, model.log and locks."""
        return {
            name: data
            for name, data in self.files.items()
            if name not in ("model.done", "model.log") and not name.endswith(".lock")
        }


@dataclass
class StockCache:
    root: Path
    placed: list[Placed] = field(default_factory=list)
    _serial: int = 9_000_000_000_000_000_000

    def add(
        self,
        fixture: str,
        state: str = "success",
        *,
        version: str = V1,
        flags: list[str] | None = None,
        hlo_name: str = "model.hlo_module.pb",
        extra: dict[str, bytes] | None = None,
        module: bytes | None = None,
    ) -> Placed:
        """Write one entry folder in ``state``: success, failed, locked or empty."""
        flags = list(FLAGS if flags is None else flags)
        self._serial += 1
        address = f"neuronxcc-{version}/MODULE_{self._serial}+{neuron_flags_hash(flags)}"
        data = hlo(fixture) if module is None else module
        files = {hlo_name: data, "compile_flags.json": json.dumps(flags).encode()}
        if state == "success":
            files["model.neff"] = b"NEFF" + fixture.encode() + bytes(range(256)) * 8
            files.update(extra or {})
            files["model.done"] = b""
        elif state == "failed":
            files["model.log"] = b"ERROR: NCC_EVRF001 the compiler gave up\n"
        elif state == "locked":
            files[f"{hlo_name}.lock"] = b""
        elif state != "empty":
            raise ValueError(state)
        folder = self.root / address
        folder.mkdir(parents=True)
        for name, content in files.items():
            (folder / name).write_bytes(content)
        placed = Placed(address, state, files, data, flags, version)
        self.placed.append(placed)
        return placed

    def successes(self) -> list[Placed]:
        return [p for p in self.placed if p.state == "success"]


def standard_cache(root: Path) -> StockCache:
    """Every state the issue names, across two compiler-version folders:

    success x4 (one with the old ``model.hlo.pb`` name, one with ``wrapped_neff.hlo``,
    one under V2), failed, locked, empty, and two unkeyable successes (no ``--target``
    in the flags; an HLO that is not a module); plus optimum-neuron's registry beside
    the entries of V1 (docs/neuron-sdk.md#optimum-neurons-registry), which is no entry."""
    cache = StockCache(root)
    registry = root / f"neuronxcc-{V1}" / "0_REGISTRY" / "0.0.28" / "ab12cd34"
    registry.mkdir(parents=True)
    (registry / "0123456789abcdef0123.json").write_text('{"neuron": {}}')
    cache.add("block_a")
    cache.add("variant_shape", hlo_name="model.hlo.pb")
    cache.add("variant_op", version=V2, extra={"wrapped_neff.hlo": b"wrapped" * 300})
    cache.add("block_a", version=V2)
    cache.add("variant_dtype", "failed")
    cache.add("variant_constant", "locked")
    cache.add("variant_layout", "empty")
    cache.add("variant_operand_order", flags=["--model-type=transformer"])
    cache.add("attrs_ab", module=b"HloModule text, not a serialized proto")
    return cache


STANDARD_COUNTS = {"imported": 4, "failed": 1, "locked": 1, "empty": 1, "unkeyable": 2}


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def counts(stdout: str) -> dict[str, int]:
    summary: dict[str, Any] = json.loads(stdout)
    return {kind: n for kind, n in summary["counts"].items() if n}
