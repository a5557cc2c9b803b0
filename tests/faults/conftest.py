"""Fixtures for the fault suite, from the server tests: a real ``redis-server`` and
moto's S3 server, on loopback."""

from server.conftest import redis_server, s3_bucket, s3_endpoint

__all__ = ["redis_server", "s3_bucket", "s3_endpoint"]
