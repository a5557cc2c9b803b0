"""Fixtures for the recovery tests: the real services of the server tests, each
started once per session on a free loopback port (``redis_server``, moto's
``s3_endpoint``) and a fresh bucket per test (``s3_bucket``)."""

from __future__ import annotations

from server.conftest import redis_server, s3_bucket, s3_endpoint

__all__ = ["redis_server", "s3_bucket", "s3_endpoint"]
