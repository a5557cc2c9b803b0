"""A long-polling lease request keeps running after its client went away (a waiter
killed with its job, a proxy that cut the idle connection). When the holder releases,
the server grants the lease to that request: nobody receives the lease id, nobody
renews it, and every other host now waits a full TTL (30 s by default) for a holder
that does not exist. The server could check ``request.is_disconnected()`` before it
grants (and answer nothing), or grant only to requests still connected."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx
from support.lease_hosts import NS, TTL

KEY = "f" * 64


def test_a_waiter_that_hung_up_is_not_granted_the_lease(server: str) -> None:
    leases = f"{server}/v1/ns/{NS}/leases/{KEY}"
    first = httpx.post(leases, json={"holder": "host-a pid 1"}, trust_env=False).json()
    assert first["state"] == "granted"
    # Host B long-polls, then disappears (killed), without reading the answer.
    parts = urlsplit(server)
    body = json.dumps({"holder": "host-b pid 1", "wait": 20}).encode()
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(
            f"POST /v1/ns/{NS}/leases/{KEY} HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.3)
    time.sleep(0.2)
    # Host A's compile ends without an entry (it failed for a reason of its own, or
    # it renewed until now and gives up): the name should be free for host C.
    httpx.delete(leases, params={"lease": first["lease"]}, trust_env=False)
    time.sleep(0.2)
    third = httpx.post(leases, json={"holder": "host-c pid 1"}, trust_env=False).json()
    assert third["state"] == "granted", (
        f"host C waits up to {TTL} s (the TTL) for the vanished host B: {third}"
    )
