"""A blob store in an S3 bucket, or an S3-compatible service: ``s3://bucket/prefix``.

Objects live at ``<prefix>/blobs/ab/<digest>``, quarantined ones at
``<prefix>/quarantine/<digest>.<timestamp>``, named documents (documents.py) at
``<prefix>/documents/<name>``. Uploads are staged in a local directory
and sent with boto3's managed transfer (multipart for big blobs).

The endpoint comes from ``AWS_ENDPOINT_URL_S3`` or else ``AWS_ENDPOINT_URL`` (MinIO,
moto, a VPC endpoint); credentials and region come from boto3's usual chain. The URL
never carries credentials, and no message here includes any.
"""

from __future__ import annotations

import io
import os
import re
import stat
import tempfile
import threading
import weakref
from collections.abc import Hashable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3  # type: ignore[import-untyped]
from boto3.exceptions import Boto3Error  # type: ignore[import-untyped]
from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]
from botocore.response import StreamingBody  # type: ignore[import-untyped]

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError

from .base import DIGEST_PATTERN, BlobInfo
from .documents import check_name, check_prefix, is_name
from .fs import StagingArea, os_errors, quarantine_stamp

_CHUNK = 1 << 20
_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_DIGEST = re.compile(DIGEST_PATTERN)

# Short timeouts and few retries: a request handler waits on these calls, and a dead
# endpoint must become a 503 within seconds (botocore defaults to 60 s per timeout).
_CLIENT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 3,
    "read_timeout": 20,
    "retries": {"max_attempts": 3, "mode": "standard"},
    # Request threads plus multipart workers share one client.
    "max_pool_connections": 32,
    # SigV4 for presigned URLs too: botocore would sign them with the deprecated
    # SigV2 on some endpoints, which newer regions and KMS-encrypted objects refuse.
    "signature_version": "s3v4",
}
# Bounded per-upload concurrency: many uploads can run at once.
_TRANSFER = TransferConfig(
    multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4
)


@contextmanager
def s3_errors(action: str) -> Iterator[None]:
    """Translate boto3 and botocore failures into StoreError, naming only the error
    class or S3 code: botocore messages can quote request details (the client's bridge,
    which may not import this, does the same in client/bridge/s3.py)."""
    try:
        yield
    except ClientError as exc:
        raise StoreError(f"S3 {action} failed: {_error_code(exc)}") from exc
    except (BotoCoreError, Boto3Error, OSError) as exc:
        raise StoreError(f"S3 {action} failed: {type(exc).__name__}") from exc


def _error_code(exc: Any) -> str:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    return str(error.get("Code") or status)


def _is_missing(exc: Any) -> bool:
    return _error_code(exc) in _MISSING_CODES


def _parse_url(url: str) -> tuple[str, str]:
    # Messages show the expected form, not the URL: a mistyped one may hold a secret.
    form = "use s3://bucket/prefix; credentials come from the AWS credential chain"
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ConfigError(f"the s3:// blob store URL must not contain credentials; {form}")
    if parts.scheme != "s3" or parts.query or parts.fragment or not parts.netloc:
        raise ConfigError(f"the s3:// blob store URL needs a bucket and nothing else; {form}")
    return parts.netloc, parts.path.strip("/")


def make_client() -> Any:
    """An S3 client for the endpoint the environment names (the client's bridge makes
    its own alike: client/bridge/s3.py); ConfigError when boto3 cannot make one."""
    # Read here rather than left to boto3 so that path-style addressing goes with a
    # custom endpoint: MinIO or moto behind a plain host name has no bucket subdomains.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    addressing = {"addressing_style": "path"} if endpoint else {}
    config = Config(**_CLIENT_OPTIONS, s3=addressing)
    try:
        return boto3.session.Session().client("s3", endpoint_url=endpoint or None, config=config)
    except (ValueError, BotoCoreError) as exc:
        raise ConfigError(
            f"cannot create the S3 client ({type(exc).__name__}); check AWS_ENDPOINT_URL_S3, "
            "AWS_ENDPOINT_URL and the AWS region settings"
        ) from exc


def _staging_parent() -> Path:
    # A fixed place per user, not a fresh mkdtemp, so a restarted server finds and
    # clears what a killed one left. /tmp is shared: it must be a real directory of ours.
    parent = Path(tempfile.gettempdir()) / f"neffcache-s3-staging-{os.getuid()}"
    with os_errors(f"create {parent}"):
        parent.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(parent)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{parent} is not a directory owned by this user; remove it")
    return parent


class _DigestLock:
    # A class, not a bare Lock, because locks cannot be weakly referenced.
    __slots__ = ("__weakref__", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()


class S3BlobStore:
    """Blobs as objects in a bucket.

    >>> store = S3BlobStore.from_url("s3://neff-cache/prod")
    >>> store.commit(store.staging_dir() / "upload-1", digest)

    Thread-safe: the boto3 client is, and per-digest locks make concurrent commits of
    one digest in this process upload it once. Two processes can both upload a digest;
    the bytes are identical and verified, so the second write changes nothing.
    """

    # Keys per LIST request: S3's own maximum. The tests lower it on an instance to see
    # a listing follow its pages without writing a thousand objects.
    list_page_size = 1000

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self._client = client
        self._bucket = bucket
        self._base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._staging = StagingArea(_staging_parent())
        # Entries vanish when no commit holds them, so the map stays small.
        self._digest_locks: weakref.WeakValueDictionary[str, _DigestLock] = (
            weakref.WeakValueDictionary()
        )
        self._digest_locks_guard = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> S3BlobStore:
        bucket, prefix = _parse_url(url)
        return cls(make_client(), bucket, prefix)

    def _blob_key(self, digest: str) -> str:
        return f"{self._base}blobs/{digest[:2]}/{digest}"

    def staging_dir(self) -> Path:
        return self._staging.path

    def commit(self, staged: Path, digest: str) -> bool:
        key = self._blob_key(digest)
        try:
            with self._digest_lock(digest):
                if self._head(key) is not None:
                    return False
                with s3_errors("upload"):
                    self._client.upload_file(str(staged), self._bucket, key, Config=_TRANSFER)
                return True
        finally:
            with suppress(OSError):
                staged.unlink(missing_ok=True)

    @contextmanager
    def _digest_lock(self, digest: str) -> Iterator[None]:
        with self._digest_locks_guard:
            entry = self._digest_locks.get(digest)
            if entry is None:
                entry = self._digest_locks[digest] = _DigestLock()
        with entry.lock:
            yield

    def size(self, digest: str) -> int | None:
        return self._head(self._blob_key(digest))

    def _head(self, key: str) -> int | None:
        with s3_errors("HEAD"):
            try:
                response = self._client.head_object(Bucket=self._bucket, Key=key)
            except ClientError as exc:
                if _is_missing(exc):
                    return None
                raise
        return int(response["ContentLength"])

    def read(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes] | None:
        chunks = self._stream(self._blob_key(digest), start, end)
        # Run it to its first yield so the GET happens now: a miss is None rather than
        # an empty stream.
        if next(chunks, None) is None:
            return None
        return chunks

    def _stream(self, key: str, start: int, end: int | None) -> Iterator[bytes]:
        """Yields b"" once the object is known to exist (see ``read``), then its bytes
        [start, end) in chunks; yields nothing if it is absent."""
        if end is not None and end <= start:
            # S3 has no empty range; only whether the object exists matters.
            if self._head(key) is not None:
                yield b""
            return
        body = self._get(key, start, end)
        if body is None:
            return
        try:
            yield b""
            with s3_errors("GET body"):
                yield from body.iter_chunks(_CHUNK)
        finally:
            body.close()

    def _get(self, key: str, start: int, end: int | None) -> Any | None:
        request: dict[str, Any] = {"Bucket": self._bucket, "Key": key}
        if start or end is not None:
            request["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        with s3_errors("GET"):
            try:
                return self._client.get_object(**request)["Body"]
            except ClientError as exc:
                if _is_missing(exc):
                    return None
                if _error_code(exc) == "InvalidRange":
                    # The range starts at or past the end of an object that exists.
                    return StreamingBody(io.BytesIO(b""), 0)
                raise

    def stamp(self, digest: str) -> tuple[Hashable, float] | None:
        return None  # nothing tells a change apart: every read is verified

    def local_path(self, digest: str) -> Path | None:
        return None

    def presign(self, digest: str, seconds: int) -> str:
        """A URL that GETs the blob without credentials for ``seconds``: the server
        can answer a big download with a redirect and no byte passes through Python.
        Signing is local (no request), so this says nothing of whether the blob is
        there; the caller checks first. ``seconds`` is capped by how long the signing
        credentials last (an instance role's: hours)."""
        with s3_errors("presign"):
            url: str = self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self._bucket, "Key": self._blob_key(digest)},
                ExpiresIn=seconds,
            )
        return url

    def quarantine(self, digest: str) -> None:
        key = self._blob_key(digest)
        target = f"{self._base}quarantine/{digest}.{quarantine_stamp()}"
        with s3_errors("quarantine"):
            try:
                # The managed copy, unlike copy_object, handles objects over 5 GB.
                self._client.copy(
                    {"Bucket": self._bucket, "Key": key}, self._bucket, target, Config=_TRANSFER
                )
            except ClientError as exc:
                if _is_missing(exc):
                    return
                raise
            self._client.delete_object(Bucket=self._bucket, Key=key)

    def delete(self, digest: str) -> bool:
        key = self._blob_key(digest)
        # DELETE succeeds whether or not the key exists; HEAD tells which it was.
        if self._head(key) is None:
            return False
        with s3_errors("DELETE"):
            self._client.delete_object(Bucket=self._bucket, Key=key)
        return True

    def blobs(self) -> Iterator[BlobInfo]:
        for item in self._listing(f"{self._base}blobs/"):
            key = item["Key"]
            digest = key.rpartition("/")[2]
            # Only exactly <prefix>/blobs/ab/<digest>: nothing else there is a blob.
            if _DIGEST.fullmatch(digest) and key == self._blob_key(digest):
                yield BlobInfo(digest, int(item["Size"]), item["LastModified"].timestamp())

    # --- documents

    def put_document(self, name: str, data: bytes, *, create_only: bool = False) -> bool:
        # A single PUT is atomic and durable once S3 answers it; If-None-Match makes it
        # conditional (S3 since 2024, MinIO; a store that ignores it overwrites).
        request: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": f"{self._base}documents/{check_name(name)}",
            "Body": data,
        }
        if create_only:
            request["IfNoneMatch"] = "*"
        with s3_errors("PUT document"):
            try:
                self._client.put_object(**request)
            except ClientError as exc:
                if _error_code(exc) in ("PreconditionFailed", "412"):
                    return False
                raise
        return True

    def get_document(self, name: str) -> bytes | None:
        body = self._get(f"{self._base}documents/{check_name(name)}", 0, None)
        if body is None:
            return None
        try:
            with s3_errors("GET document"):
                data: bytes = body.read()
        finally:
            body.close()
        return data

    def delete_document(self, name: str) -> bool:
        key = f"{self._base}documents/{check_name(name)}"
        if self._head(key) is None:
            return False
        with s3_errors("DELETE document"):
            self._client.delete_object(Bucket=self._bucket, Key=key)
        return True

    def documents(self, prefix: str) -> Iterator[str]:
        base = f"{self._base}documents/"
        for item in self._listing(base + check_prefix(prefix)):
            name = item["Key"][len(base) :]
            if is_name(name):
                yield name

    def _listing(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix``, as ``list_objects_v2`` describes it."""
        with s3_errors("LIST"):
            pages = iter(
                self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self._bucket,
                    Prefix=prefix,
                    PaginationConfig={"PageSize": self.list_page_size},
                )
            )
        while True:
            # Each page is a request, made when the listing reaches it.
            with s3_errors("LIST"):
                page = next(pages, None)
            if page is None:
                return
            yield from page.get("Contents", ())

    def check(self) -> None:
        with s3_errors("HEAD bucket"):
            self._client.head_bucket(Bucket=self._bucket)

    def close(self) -> None:
        self._staging.close()
        self._client.close()
