"""MLIR keying benchmark: fingerprint_mlir per MiB against fingerprint_hlo per MiB.

    pip install -e '.[dev,bench]' && python tests/bench/bench_mlir_keying.py [--layers 2200]

One program, two inputs: a deep, unrolled JAX training step (value_and_grad and a
momentum update, as in bench_keying.py), lowered once and written both as StableHLO
bytecode (what TorchNeuron hands neuronx-cc, through MLIR's own bytecode writer) and
as an HloModuleProto; both are cached under tests/bench/.data/. Each input is timed
per MiB of itself:

1. ``fingerprint_mlir`` per MiB of bytecode as a ratio to ``fingerprint_hlo`` per MiB
   of the HloModuleProto. Goal: at most 2.0x. Bytecode is far denser than the proto
   (the same program is several times smaller), so a MiB of it holds several times
   more operations; the ratio says what keying a MiB of each costs.
2. both against raw BLAKE3 of the same bytes, the floor of any keying.

The three run in alternating rounds (so each gets the same luck from whatever else
runs on the machine) and the best of each is kept. No assertion: performance claims
live here, not in tests.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

from neffcache.keying import fingerprint_hlo, fingerprint_mlir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from needs import require_jax
from results import record

DATA = Path(__file__).resolve().parent / ".data"
MIB = 2**20


def training_step(layers: int) -> tuple[bytes, bytes]:
    """(StableHLO bytecode, HloModuleProto) of one training step, cached."""
    mlir_path = DATA / f"train_step_{layers}.mlirbc"
    hlo_path = DATA / f"train_step_{layers}_twin.pb"
    if mlir_path.exists() and hlo_path.exists():
        return mlir_path.read_bytes(), hlo_path.read_bytes()
    require_jax("bench_mlir_keying.py")
    import jax
    import jax.numpy as jnp
    from jax._src.interpreters import mlir

    def loss(params: Any, x: Any, y: Any) -> Any:
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
            h = h / (1.0 + jnp.mean(h * h, axis=-1, keepdims=True))
        return jnp.mean((h - y) ** 2)

    def step(params: Any, m: Any, x: Any, y: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x, y)
        m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
        params = jax.tree.map(lambda p, v: p - 1e-3 * v / (jnp.abs(v) + 1e-8), params, m)
        return params, m, value

    params = [(jnp.ones((32, 32)), jnp.ones((32,))) for _ in range(layers)]
    x = jnp.ones((8, 32))
    lowered = jax.jit(step).lower(params, params, x, x)
    bytecode: bytes = mlir.module_to_bytecode(lowered.compiler_ir("stablehlo"))
    proto: bytes = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    DATA.mkdir(exist_ok=True)
    mlir_path.write_bytes(bytecode)
    hlo_path.write_bytes(proto)
    return bytecode, proto


def best_of(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best time of each function, run in alternating rounds after a warm-up."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for label, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            best[label] = min(best[label], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2200, help="depth of the traced model")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a 400-layer module, 5 repeats")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.repeat = 400, 5
    bytecode, proto = training_step(args.layers)
    mlir_mib, hlo_mib = len(bytecode) / MIB, len(proto) / MIB
    print(f"machine: {platform.machine()} {platform.python_version()}, blake3 {blake3.__version__}")
    print(f"program: {args.layers} layers; StableHLO bytecode {mlir_mib:.2f} MiB, "
          f"HloModuleProto {hlo_mib:.2f} MiB ({hlo_mib / mlir_mib:.1f}x larger)")  # fmt: skip

    times = best_of(
        {
            "fingerprint_mlir": lambda: fingerprint_mlir(bytecode),
            "fingerprint_hlo": lambda: fingerprint_hlo(proto),
            "blake3 bytecode": lambda: blake3.blake3(bytecode).hexdigest(),
            "blake3 proto": lambda: blake3.blake3(proto).hexdigest(),
        },
        args.repeat,
    )
    per_mib = {
        "fingerprint_mlir": times["fingerprint_mlir"] / mlir_mib,
        "fingerprint_hlo": times["fingerprint_hlo"] / hlo_mib,
        "blake3 bytecode": times["blake3 bytecode"] / mlir_mib,
        "blake3 proto": times["blake3 proto"] / hlo_mib,
    }
    for label, seconds in times.items():
        print(f"{label:17s} {seconds * 1e3:8.1f} ms  = {per_mib[label] * 1e3:8.2f} ms/MiB")
    ratio = per_mib["fingerprint_mlir"] / per_mib["fingerprint_hlo"]
    print(f"RATIO fingerprint_mlir / fingerprint_hlo per MiB = {ratio:.2f}x (goal <= 2.0)")
    print(f"ratio fingerprint_mlir / raw blake3 per MiB = "
          f"{per_mib['fingerprint_mlir'] / per_mib['blake3 bytecode']:.0f}x; "
          f"fingerprint_hlo / raw blake3 = "
          f"{per_mib['fingerprint_hlo'] / per_mib['blake3 proto']:.0f}x")  # fmt: skip
    print(f"per program: fingerprint_mlir / fingerprint_hlo = "
          f"{times['fingerprint_mlir'] / times['fingerprint_hlo']:.2f}x")  # fmt: skip
    record(
        "mlir_keying",
        f"fingerprint_mlir per MiB of a {mlir_mib:.1f} MiB StableHLO module",
        per_mib["fingerprint_mlir"] * 1e3,
        "fingerprint_hlo per MiB of the same program's HloModuleProto",
        per_mib["fingerprint_hlo"] * 1e3,
        "ms/MiB",
        better="lower",
        goal="<= 2.0x",
    )
    record(
        "mlir_keying",
        "fingerprint_mlir per MiB",
        per_mib["fingerprint_mlir"] * 1e3,
        "raw BLAKE3 of the same bytes",
        per_mib["blake3 bytecode"] * 1e3,
        "ms/MiB",
        better="lower",
        note="the floor of any keying",
    )


if __name__ == "__main__":
    main()
