"""The pacing pause in ``Leases.acquire_or_wait`` fires whenever a long-poll came back
in less than half of the wait asked for. A server whose ``lease_wait_max_seconds`` is
below 15 s (docs/configuration.md: "keep it under any proxy's idle timeout", so a
10 s setting behind a 15 s proxy is what the docs ask for) always answers in less
than half of the client's 30 s poll: after every long-poll the client then sleeps
max(1, TTL / 3) = 10 s with no request open, and hears of the publish up to 10 s
late, on every host of the herd. The pause is meant for servers that do not hold the
request at all (answers in milliseconds), not for ones that hold it a little less
than asked.

The client and the stand-in server share one virtual clock (``Clock``): how late the
client heard of the publish is exact, and the test takes no real time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.client_units import Clock
from support.lease_hosts import make_config

from neffcache.client import lease
from neffcache.client.lease import Leases
from neffcache.client.remote import LeaseAnswer

CAP = 2.0  # the server's lease_wait_max_seconds
KEY = "d" * 64


class CappedServer:
    """Holds each long-poll for at most CAP seconds; the entry is published 3 s in."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started = clock.monotonic()
        self.published_at = self.started + 3.0

    def lease(self, name: str, wait: float, holder: str, **_: Any) -> LeaseAnswer:
        end = self.clock.monotonic() + min(wait, CAP)
        while self.clock.monotonic() < end:
            if self.clock.monotonic() >= self.published_at:
                return LeaseAnswer("done", "", 30.0, "", 0.0, None, {"key": KEY})
            self.clock.sleep(0.01)
        if self.clock.monotonic() >= self.published_at:
            return LeaseAnswer("done", "", 30.0, "", 0.0, None, {"key": KEY})
        held_for = self.clock.monotonic() - self.started
        return LeaseAnswer("held", "", 30.0, "other-host pid 1", held_for, None, None)


def test_a_server_with_a_short_long_poll_cap_is_not_left_unheard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock().install(monkeypatch, lease)
    server = CappedServer(clock)
    wait = Leases(server, make_config("http://127.0.0.1:9", tmp_path)).acquire_or_wait(KEY)  # type: ignore[arg-type]
    assert wait.state == "done"
    late = clock.now - server.published_at
    assert late < 2.0, f"heard of the publish {late:.1f} s after it"
