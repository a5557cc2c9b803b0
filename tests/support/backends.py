"""The storage backends tests run against, and the one ``--backend`` option that
chooses them (tests/conftest.py adds the option and imports the fixtures).

A fixture that runs a test once per backend takes its params from ``backends``: each
param names the backends it uses (``"filesystem+redis"``: blobs on the filesystem, the
index in Redis) and carries a ``backend`` mark with them. ``--backend sqlite,redis``
(or the option repeated) runs only the params whose backends are all chosen; the
default chooses all. A param that uses Redis or S3 starts ``redis-server`` or moto
(support/services.py), so it is also marked ``e2e``.

A test that asks for ``redis_server`` or ``s3_endpoint`` itself is marked the same way
(``mark_service_users``). ``stores`` is the shared (blob store, index) fixture and
``any_index`` the shared index fixture (``documented_index`` the same wrapped in
``DurableIndex``); ``open_index_of``, ``IndexHandles``,
``open_blob_store_of`` and ``stores_of`` open one backend of a kind, for modules whose
matrix or whose fixture's shape is their own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the server is imported when a test opens a store, not before
    from neffcache.server.blobs import BlobStore
    from neffcache.server.index import Index
    from neffcache.server.recovery.durable import DurableIndex

INDEXES = ("memory", "sqlite", "redis")
BLOB_STORES = ("memory", "filesystem", "s3")
BACKENDS = ("memory", "sqlite", "redis", "filesystem", "s3")
# Backends served by a process a test starts: a param using one is end to end.
SERVICES = frozenset({"redis", "s3"})


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        action="append",
        default=[],
        metavar="NAME[,NAME...]",
        help=f"run the backend matrices only with these backends ({', '.join(BACKENDS)}); "
        "repeatable; default: all",
    )


def chosen(config: pytest.Config) -> frozenset[str]:
    """The backends ``--backend`` chose (all by default); an unknown name is a usage
    error naming the known ones."""
    names = {name.strip() for value in config.getoption("backend") for name in value.split(",")}
    names.discard("")
    unknown = sorted(names - set(BACKENDS))
    if unknown:
        raise pytest.UsageError(
            f"--backend: unknown {', '.join(unknown)}; choose from {', '.join(BACKENDS)}"
        )
    return frozenset(names or BACKENDS)


def deselect_unchosen(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the items whose backend params use a backend ``--backend`` left out."""
    wanted = chosen(config)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        used = {name for mark in item.iter_markers("backend") for name in mark.args}
        (kept if used <= wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def backends(*specs: str) -> list[Any]:
    """Fixture params, one per spec: ``"sqlite"``, or ``"filesystem+redis"`` for a blob
    store and an index; each marked with the backends it uses."""
    params = []
    for spec in specs:
        used = spec.split("+")
        unknown = set(used) - set(BACKENDS)
        assert not unknown, f"no backend {unknown} in {spec!r}"
        marks = [pytest.mark.backend(*used)]
        if SERVICES.intersection(used):
            marks.append(pytest.mark.e2e)
        params.append(pytest.param(spec, marks=marks, id=spec))
    return params


def flush_redis(url: str) -> None:
    import redis  # here, not at the top: only Redis params need it

    with redis.Redis.from_url(url) as connection:
        connection.flushdb()


def index_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty index of ``kind`` (sqlite or redis; Redis flushed first)."""
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'index.db'}"
    assert kind == "redis", kind
    url: str = request.getfixturevalue("redis_server")
    flush_redis(url)
    return url


def open_index_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Index:
    """An empty index of ``kind``; the caller closes it."""
    from neffcache.server.index import open_index
    from neffcache.server.index.memory import MemoryIndex

    if kind == "memory":
        return MemoryIndex()
    return open_index(index_url(kind, request, tmp_path))


class IndexHandles:
    """One index of a kind, and new handles on it as a replica would open them (memory:
    the same index, which has no second handle); ``close`` closes every handle.
    ``documented``: each handle wrapped in ``DurableIndex`` over one shared in-memory
    blob store, whose ``documents`` are then ``self.documents``."""

    def __init__(
        self,
        kind: str,
        request: pytest.FixtureRequest,
        tmp_path: Path,
        *,
        documented: bool = False,
    ) -> None:
        from neffcache.server.blobs.memory import MemoryBlobStore
        from neffcache.server.index.memory import MemoryIndex

        self.kind = kind
        self._handles: list[Index] = []
        self._memory = MemoryIndex() if kind == "memory" else None
        self._url = "" if kind == "memory" else index_url(kind, request, tmp_path)
        self.documents = MemoryBlobStore() if documented else None

    def open(self) -> Index:
        from neffcache.server.index import open_index
        from neffcache.server.recovery.durable import DurableIndex

        index: Index
        if self._memory is not None:
            index = self._memory
        else:
            index = open_index(self._url)
            self._handles.append(index)
        return index if self.documents is None else DurableIndex(index, self.documents)

    def close(self) -> None:
        for handle in self._handles:
            handle.close()
        if self.documents is not None:
            self.documents.close()


class LentClient:
    """The session's S3 client, lent to one test's store: the store's ``close`` must
    leave it open for the next test (making a boto3 client takes from a quarter of a
    second to a second, more than most tests that use one)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        """The session's fixture closes the client."""


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Iterator[Any]:
    """One S3 client on moto for the session, made as ``S3BlobStore.from_url`` makes one."""
    from neffcache.server.blobs.s3 import make_client

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
        client = make_client()
    yield client
    client.close()


def open_blob_store_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    """An empty blob store of ``kind`` (S3: a fresh bucket through the session's
    client); the caller closes it."""
    from neffcache.server.blobs import open_blob_store
    from neffcache.server.blobs.memory import MemoryBlobStore
    from neffcache.server.blobs.s3 import S3BlobStore

    if kind == "memory":
        return MemoryBlobStore()
    if kind == "filesystem":
        return open_blob_store((tmp_path / "store").as_uri())
    assert kind == "s3", kind
    url: str = request.getfixturevalue("s3_bucket")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return S3BlobStore(LentClient(request.getfixturevalue("s3_client")), bucket, prefix)


def stores_of(spec: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[BlobStore, Index]:
    """An empty blob store and index for ``spec`` (``"memory"``: both in memory); the
    caller closes them."""
    blob_kind, _, index_kind = spec.partition("+")
    blobs = open_blob_store_of(blob_kind, request, tmp_path)
    return blobs, open_index_of(index_kind or blob_kind, request, tmp_path)


def open_stores(
    spec: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[BlobStore, Index]]:
    """``stores_of(spec)``, closed after the test."""
    blobs, index = stores_of(spec, request, tmp_path)
    yield blobs, index
    blobs.close()
    index.close()


# The API over each index, and over S3; memory for the in-process contract.
STORES: Sequence[str] = ("memory", "filesystem+sqlite", "filesystem+redis", "s3+sqlite")


@pytest.fixture(params=backends(*STORES))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[BlobStore, Index]]:
    """A blob store and an index the test's app serves, one param per backend pair."""
    yield from open_stores(request.param, request, tmp_path)


@pytest.fixture(params=backends(*INDEXES))
def any_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    """An empty index of each kind."""
    index = open_index_of(request.param, request, tmp_path)
    yield index
    index.close()


@pytest.fixture(params=backends(*INDEXES))
def documented_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DurableIndex]:
    """An empty index of each kind wrapped in ``DurableIndex``, its documents in an
    in-memory blob store (``IndexHandles(documented=True)``)."""
    from neffcache.server.recovery.durable import DurableIndex

    handles = IndexHandles(request.param, request, tmp_path / "data", documented=True)
    index = handles.open()
    assert isinstance(index, DurableIndex)
    yield index
    handles.close()


# The fixtures that start a service, and the backend each serves: a test that asks for
# one (directly or through another fixture) uses that backend and is end to end.
SERVICE_FIXTURES = {"redis_server": "redis", "s3_endpoint": "s3"}


def mark_service_users(items: list[pytest.Item]) -> None:
    """Mark ``e2e`` and ``backend`` the tests that ask for a service fixture."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        used = [backend for fixture, backend in SERVICE_FIXTURES.items() if fixture in names]
        if used:
            item.add_marker(pytest.mark.backend(*used))
            item.add_marker(pytest.mark.e2e)
