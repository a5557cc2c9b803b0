"""The fleet's training job: a sequence of real ``HloModuleProto`` fixtures, each with a
modelled compile time and NEFF size, and the table the compiler wrapper reads them from.

Every fixture is a distinct program (its own group in tests/fixtures/hlo/jax.json or
torch_xla.json), so neither the stock key nor neffcache's canonical key can merge two
of them: the counts below are the same for every cache that keys correctly. No renamed
duplicate is included: with the hook alone (no shim on PATH) and the stand-in SDK's
probe-before-writing-the-HLO order, neffcache looks such a graph up by its stock address
only, and compiles it as the stock cache does (docs/client.md, "Why both").

The modelled compile times are minutes, as neuronx-cc takes for real models: two long
step graphs (training step, last partial batch) of 40-45 minutes, an optimizer step
and an eval forward of 12-20 minutes, and small graphs (collectives, loss scaling,
layout changes) of 1-8 minutes. They are a plausible shape, not measurements: the
SDK notes (docs/neuron-sdk.md) have no compile times. The NEFF sizes (256 KiB to 2 MiB)
are of the order of the 1.5 MiB NxDI NEFF in docs/neuron-sdk.md#entry-layout; big
models' NEFFs are larger, which would move more bytes for every cache in proportion.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
HLO_DIR = TESTS / "fixtures" / "hlo"
KiB = 1024


@dataclass(frozen=True)
class Graph:
    """One graph of the job: a fixture, what it stands for, and what it costs."""

    fixture: str
    role: str
    modelled_minutes: float
    neff_bytes: int

    @property
    def path(self) -> Path:
        return HLO_DIR / f"{self.fixture}.pb"

    @property
    def modelled_seconds(self) -> float:
        return self.modelled_minutes * 60

    def scaled_seconds(self, scale: float) -> float:
        """How long the stand-in compile sleeps for this graph."""
        return self.modelled_seconds * scale


# In job order; --graphs N takes the first N, so the first five are a mix of long and
# short compiles.
CATALOGUE = (
    Graph("torch_block", "training step (forward + backward)", 45, 2048 * KiB),
    Graph("allreduce_groups_pair", "gradient all-reduce", 3, 256 * KiB),
    Graph("variant_dtype", "optimizer step (bf16)", 20, 1536 * KiB),
    Graph("variant_constant", "loss scaling", 2, 256 * KiB),
    Graph("block_a", "eval forward", 12, 1024 * KiB),
    Graph("torch_variant_shape", "last partial batch step", 40, 2048 * KiB),
    Graph("variant_sharding_rows", "sharded embedding", 8, 768 * KiB),
    Graph("variant_op", "activation", 6, 512 * KiB),
    Graph("variant_operand_order", "bias add", 4, 384 * KiB),
    Graph("variant_layout", "weight transpose", 1, 256 * KiB),
)


def sequence(count: int) -> list[Graph]:
    if not 1 <= count <= len(CATALOGUE):
        raise ValueError(f"--graphs must be 1 to {len(CATALOGUE)}")
    return list(CATALOGUE[:count])


def input_digest(data: bytes) -> str:
    """How the compiler wrapper recognises a graph: sha256 of the HLO bytes it is given
    (the stand-in SDK copies the module's bytes unchanged into its work directory)."""
    return hashlib.sha256(data).hexdigest()


def write_table(graphs: list[Graph], scale: float, path: Path) -> None:
    """The compiler wrapper's table: input digest -> name, sleep seconds, NEFF bytes."""
    table = {
        input_digest(g.path.read_bytes()): {
            "graph": g.fixture,
            "seconds": g.scaled_seconds(scale),
            "neff_bytes": g.neff_bytes,
        }
        for g in graphs
    }
    if len(table) != len(graphs):
        raise ValueError("two graphs of the sequence have the same bytes")
    path.write_text(json.dumps(table, indent=1))
