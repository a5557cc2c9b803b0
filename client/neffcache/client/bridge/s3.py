"""boto3 for the bridge's ``s3://`` source, from the ``s3`` extra: imported inside
the functions, so only a run that reads S3 needs it (``tests/test_structure.py``
allows this module, and only it, to import boto3).

The same client as the server's S3 blob store (``server/blobs/s3.py``, which the
client may not import): the endpoint from ``AWS_ENDPOINT_URL_S3``, else
``AWS_ENDPOINT_URL``, with path-style addressing for a custom one (MinIO or moto
behind a plain host name have no bucket subdomains); credentials and region from
boto3's usual chain. Errors name only the S3 error code or the exception's class:
botocore's messages can quote request details.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# A person waits on a listing or a download: a dead endpoint fails within seconds.
_CLIENT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 3,
    "read_timeout": 20,
    "retries": {"max_attempts": 3, "mode": "standard"},
}


class S3Error(Exception):
    """An S3 request failed, or no client could be made; the message is one line."""


def make_client() -> Any:
    """An S3 client for the endpoint the environment names; S3Error when boto3 is not
    installed or cannot make one."""
    try:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
        from botocore.exceptions import BotoCoreError  # type: ignore[import-untyped]
    except ImportError:
        raise S3Error("reading s3:// needs boto3: pip install 'neffcache[s3]'") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    addressing = {"addressing_style": "path"} if endpoint else {}
    config = Config(**_CLIENT_OPTIONS, s3=addressing)
    try:
        return boto3.session.Session().client("s3", endpoint_url=endpoint or None, config=config)
    except (ValueError, BotoCoreError) as exc:
        raise S3Error(
            f"cannot create the S3 client ({type(exc).__name__}); check AWS_ENDPOINT_URL_S3, "
            "AWS_ENDPOINT_URL and the AWS region settings"
        ) from exc


@contextmanager
def s3_errors(action: str) -> Iterator[None]:
    """boto3's and botocore's failures as S3Error, naming only the error code or class
    (boto3 is installed: a client was made)."""
    from boto3.exceptions import Boto3Error  # type: ignore[import-untyped]
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        raise S3Error(f"S3 {action} failed: {_error_code(exc)}") from exc
    except (BotoCoreError, Boto3Error, OSError) as exc:
        raise S3Error(f"S3 {action} failed: {type(exc).__name__}") from exc


def _error_code(exc: Any) -> str:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    return str(error.get("Code") or status)
