"""STAND-IN for the stock ``libneuronxla`` S3 cache (``CompileCacheS3``): NOT AWS's code,
written for the fleet benchmark only, from docs/neuron-sdk.md#entry-layout, #hit-detection
and #s3-backend.

The shared stand-in (tests/standins/libneuronxla) models only the S3 backend's paths
and raises ``NotImplementedError`` for its I/O; it is not changed here. This module
subclasses it and, when installed in a rank process (``install()``), makes every
binding of ``create_compile_cache`` return the subclass for ``s3://`` URLs, as
optimum-neuron patches it "everywhere it was imported"
(docs/neuron-sdk.md#libneuronxla-cache-api).

What it does, and how sure that is:

* The layout under the prefix is the directory layout: ``<prefix>/neuronxcc-<ver>/
  MODULE_<key>+<flags8>/model.neff`` and the rest (docs/neuron-sdk.md#s3-backend [DOC],
  #cache-location [3P]).
* Each file is its own object, written with boto3 (docs/neuron-sdk.md#s3-backend [LOG]:
  the PutObject of ``model.hlo_module.pb`` in the SlowDown error). One ``PutObject`` per
  file: the files are far below boto3's multipart threshold, where ``upload_file`` also
  does one PutObject.
* A hit is ``model.done`` existing (a ``HeadObject``), then ``model.neff`` downloaded;
  a miss probes ``model.log`` (docs/neuron-sdk.md#hit-detection [GUESS], the order the
  stand-in SDK's wrapper already follows). The probes are the SDK wrapper's; this class
  answers them.
* Locks: none. [GUESS] docs/neuron-sdk.md#s3-backend: "How locking works on S3 is not
  visible: either there is no cross-node lock or a marker object is used; classic S3 has
  no atomic create-if-absent." Nothing in docs/neuron-sdk.md says ranks on one host share
  a local lock for an S3 cache either (the cache-wide ``<root>/lock`` of
  #cache-wide-lock is the filesystem backend's), so ``hlo_acquire_lock`` does nothing:
  every rank that misses compiles. The 2.1-era SlowDown errors (#s3-backend: "that every
  rank uploaded the HLO of every graph is a GUESS") fit this. A marker-object lock would
  make the S3 peer look better in compiles, at the price of the stale-lock hangs of
  #per-entry-compile-lock.
* Not modelled: S3 throttling (moto never answers SlowDown), and S3's latency (moto is
  on loopback).

The boto3 client is made once per process (``FLEET_S3_ENDPOINT`` is the endpoint, the
credentials are the fake ones the driver sets).
"""

from __future__ import annotations

import os
from typing import Any

from libneuronxla.neuron_cc_cache import CacheUrl, CompileCache, CompileCacheS3

_client: Any = None
# Requests boto3 sent again after an error (its ResponseMetadata.RetryAttempts), and
# the body bytes those resent. moto answers 500 ("I/O operation on closed file") to
# concurrent PutObjects of one key, which real S3 takes (the last writer wins): the
# driver keeps these bytes out of the S3 peer's figure.
RETRIES = {"retries": 0, "retried_bytes": 0}


def _count_retries(response: dict[str, Any], body: int = 0) -> None:
    attempts = response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
    RETRIES["retries"] += attempts
    RETRIES["retried_bytes"] += attempts * body


def s3_client() -> Any:
    global _client
    if _client is None:
        import boto3  # type: ignore[import-untyped]

        _client = boto3.session.Session().client(
            "s3", endpoint_url=os.environ["FLEET_S3_ENDPOINT"], region_name="us-east-1"
        )
    return _client


def _split(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``(bucket, some/key)``."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key


class FleetCompileCacheS3(CompileCacheS3):
    """``CompileCacheS3`` with its I/O done against S3: one object per file, no locks."""

    def __init__(self, cache_url: CacheUrl) -> None:
        super().__init__(cache_url)
        self.s3 = s3_client()

    def exists(self, path: str) -> bool:
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        bucket, key = _split(path)
        try:
            _count_retries(self.s3.head_object(Bucket=bucket, Key=key))
        except ClientError as exc:
            _count_retries(exc.response)
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def _get(self, path: str) -> bytes:
        bucket, key = _split(path)
        response = self.s3.get_object(Bucket=bucket, Key=key)
        _count_retries(response)
        data: bytes = response["Body"].read()
        return data

    def download_file(self, path: str, dst_path: str) -> None:
        parent = os.path.dirname(dst_path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(dst_path, "wb") as out:
            out.write(self._get(path))

    def download_file_to_string(self, path: str, limit: int | None = None) -> str:
        data = self._get(path)
        return (data if limit is None else data[:limit]).decode("utf-8", errors="replace")

    def _put(self, cache_path: str, data: bytes) -> None:
        bucket, key = _split(cache_path)
        _count_retries(self.s3.put_object(Bucket=bucket, Key=key, Body=data), len(data))

    def upload_file(self, cache_path: str, src_path: str) -> None:
        with open(src_path, "rb") as src:
            self._put(cache_path, src.read())

    def upload_string_to_file(self, cache_path: str, data: str | bytes) -> None:
        self._put(cache_path, data.encode("utf-8") if isinstance(data, str) else data)

    def remove(self, path: str) -> None:
        bucket, key = _split(path)
        self.s3.delete_object(Bucket=bucket, Key=key)

    def hlo_acquire_lock(self, hlo_path: str, timeout: float | None = None) -> None:
        """[GUESS] No lock on S3 (see the module docstring)."""

    def hlo_release_lock(self, hlo_path: str) -> None:
        """[GUESS] No lock on S3 (see the module docstring)."""


def install() -> None:
    """Make every binding of ``create_compile_cache`` return the S3 stand-in for
    ``s3://`` URLs, and make the boto3 client now (process start-up, not the job)."""
    import libneuronxla
    from libneuronxla import neuron_cc_cache, neuron_cc_wrapper

    original = neuron_cc_cache.create_compile_cache

    def create_compile_cache(cache_url: CacheUrl) -> CompileCache:
        if cache_url.is_s3():
            return FleetCompileCacheS3(cache_url)
        return original(cache_url)

    for module in (libneuronxla, neuron_cc_cache, neuron_cc_wrapper):
        module.create_compile_cache = create_compile_cache  # type: ignore[attr-defined]
    s3_client()
