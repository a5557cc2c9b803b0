"""Fixtures for the explanation tests: the real ``redis-server`` of the server tests
(started once per session on a free loopback port)."""

from __future__ import annotations

from server.conftest import redis_server

__all__ = ["redis_server"]
