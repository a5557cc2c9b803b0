"""What the lease tests (tests/leases) share: the namespace and lease TTL of their
server, a client config for a host pointing at it, a look at a lease from another
host, and the graph and stock address each host compiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neffcache.client.config import ClientConfig
from support.client_units import VERSION

NS = "leases"
# Seconds: lease_ttl_seconds of tests/leases/conftest.py's ``server``.
TTL = 1.5
TESTS = Path(__file__).resolve().parents[1]
HLO = (TESTS / "fixtures" / "hlo" / "block_a.pb").read_bytes()
A1 = f"neuronxcc-{VERSION}/MODULE_111+abcdef01"  # this run's address


def make_config(url: str, l1: Path | str, **extra: str) -> ClientConfig:
    env = {
        "NEFFCACHE_URL": f"neffcache+{url}/{NS}",
        "NEFFCACHE_LOCAL_DIR": str(l1),
        "NEFFCACHE_TIMEOUT": "5",
        **extra,
    }
    made = ClientConfig.from_env(env)
    assert made is not None
    return made


def peek(url: str, name: str) -> dict[str, Any]:
    """What another host sees of a lease, without taking it."""
    import httpx

    seen: dict[str, Any] = httpx.post(
        f"{url}/v1/ns/{NS}/leases/{name}",
        json={"holder": "other-host pid 1", "take": False},
        timeout=10,
        trust_env=False,
    ).json()
    return seen
