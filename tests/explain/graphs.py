"""Real graphs for the explanation tests: committed HLO fixtures, their keys under a
compile context, and the manifests a client would publish for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import blake3

from neffcache.keying import (
    CompileContext,
    KeyInputs,
    compute_key,
    fingerprint_hlo,
    graph_summary,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hlo"
OLD = "2.20.9961.0+0acef03a"
NEW = "2.21.1.0+6b1fa2e4"


def hlo(name: str) -> bytes:
    return (FIXTURES / f"{name}.pb").read_bytes()


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


class Graph:
    """One module in one compile context: its key, components and graph summary."""

    def __init__(
        self,
        module: bytes,
        version: str = OLD,
        target: str = "trn1",
        flags: tuple[str, ...] = ("--model-type=transformer", "--optlevel=1"),
        env: dict[str, str] | None = None,
    ) -> None:
        self.module = module
        context = CompileContext.create(
            compiler_version=version, target=target, flags=list(flags), env=env
        )
        made = compute_key(KeyInputs(fingerprint_hlo(module), context))
        self.key = made.key
        self.components: dict[str, Any] = made.as_json()
        self.summary = graph_summary(module)

    def with_(self, **changes: Any) -> Graph:
        module = changes.pop("module", self.module)
        fields: dict[str, Any] = {
            "version": self.components["compiler_version"],
            "target": self.components["target"],
            "flags": tuple(self.components["flags"]),
            "env": self.components["env"],
        }
        fields.update(changes)
        return Graph(module, **fields)

    def request(self, **extra: Any) -> dict[str, Any]:
        """The body of POST /v1/ns/{ns}/explain for this graph."""
        return {
            "key": self.key,
            "components": self.components,
            "graph": self.summary.as_json(shapes_max=None),
            **extra,
        }

    def manifest(self, neff: bytes, **extra: Any) -> dict[str, Any]:
        """What a client publishes: the NEFF and the HLO module it was compiled from."""
        return {
            "key": self.key,
            "components": self.components,
            "files": {
                "model.neff": {"digest": digest(neff), "size": len(neff)},
                "model.hlo_module.pb": {"digest": digest(self.module), "size": len(self.module)},
            },
            **extra,
        }

    def files(self, neff: bytes) -> list[bytes]:
        return [neff, self.module]
