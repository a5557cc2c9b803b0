"""Fixtures for the report tests, from the server tests: a real ``redis-server``
(started once per session on a free loopback port) and a port nothing listens on."""

from __future__ import annotations

from server.conftest import redis_server, unused_port

__all__ = ["redis_server", "unused_port"]
