"""deploy/nginx/nginx.conf in front of a real server, for real: the server (in a thread
of this process, on a free loopback port) with ``accel_redirect_prefix``, and nginx on
another free port with the shipped configuration, its ports and paths filled in.

Through nginx, a blob's bytes come from the file (X-Accel-Redirect) with the server's
headers, a range too; a blob never verified, or changed since, is hashed by the server
first, so a corrupted one is a 404 and quarantined, never sent; the files are not
reachable except through the server's answer. Skipped without nginx, except under CI
(``.ci/run`` installs it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import httpx
import pytest
from loopback import InThread, free_port
from prometheus_client.parser import text_string_to_metric_families

from neffcache.server import verified
from neffcache.server.app import create_app
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.services import blobs as blob_reads
from neffcache.server.settings import ServerSettings

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "nginx" / "nginx.conf"
PREFIX = "/_neffcache"
# What the shipped configuration says, and what the test puts in its place.
LISTEN = "listen 8080;"
UPSTREAM = "server 127.0.0.1:8787;"
STORE = "/var/lib/neffcache/store/"
TMP = "/tmp/"


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed; .ci/run installs it")
        pytest.skip("nginx is not installed (the test of deploy/nginx/ needs it)")
    return found


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def filled(config: str, port: int, upstream: int, store: Path, tmp: Path) -> str:
    for token in (LISTEN, UPSTREAM, STORE, TMP):
        assert token in config, f"deploy/nginx/nginx.conf no longer says {token!r}"
    config = config.replace(TMP, f"{tmp}/")  # first: the paths put in may hold /tmp/
    config = config.replace(LISTEN, f"listen 127.0.0.1:{port};")
    config = config.replace(UPSTREAM, f"server 127.0.0.1:{upstream};")
    return config.replace(STORE, f"{store}/")


def wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"nginx exited: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx did not listen: {log.read_text()}")


@dataclass
class Front:
    url: str  # nginx
    server: str  # the server itself
    store: FsBlobStore


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    binary = nginx_binary()
    tmp = tmp_path_factory.mktemp("nginx-front")
    store_root = tmp / "store"
    settings = ServerSettings(
        data_dir=tmp / "data",
        blob_url=store_root.as_uri(),
        accel_redirect_prefix=PREFIX,
        eviction_interval_seconds=0,
    )
    app = create_app(settings)
    store = app.state.backends.blobs
    assert isinstance(store, FsBlobStore)
    with InThread(app) as server_url:
        port = free_port()
        upstream = int(server_url.rsplit(":", 1)[1])
        conf = tmp / "nginx.conf"
        conf.write_text(filled(CONFIG.read_text(), port, upstream, store_root, tmp))
        log = tmp / "nginx.log"
        directives = "daemon off; master_process on;"
        if os.geteuid() == 0:
            directives += " user root;"  # the workers read the server's 0600 files
        argv = [binary, "-p", str(tmp), "-c", str(conf), "-e", "stderr", "-g", directives]
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
        try:
            wait_listening(port, process, log)
            yield Front(f"http://127.0.0.1:{port}", server_url, store)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)


def samples(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def get(url: str, **headers: str) -> httpx.Response:
    return httpx.get(url, headers=headers, timeout=30, trust_env=False)


def upload(front: Front, data: bytes) -> str:
    key = digest(data)
    answer = httpx.put(f"{front.url}/v1/blobs/{key}", content=data, timeout=30, trust_env=False)
    assert answer.status_code == 201, answer.text
    return key


def test_nginx_sends_the_blob_file_with_the_servers_headers(front: Front) -> None:
    data = os.urandom(3 * 2**20 + 17)
    key = upload(front, data)  # an upload through nginx too
    whole = get(f"{front.url}/v1/blobs/{key}")
    assert whole.status_code == 200
    assert whole.content == data
    assert whole.headers["content-length"] == str(len(data))
    assert whole.headers["etag"] == f'"{key}"'
    assert whole.headers["content-type"] == "application/octet-stream"
    assert "x-accel-redirect" not in whole.headers
    part = get(f"{front.url}/v1/blobs/{key}", Range="bytes=100-199")
    assert part.status_code == 206
    assert part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
    metrics = samples(get(f"{front.server}/metrics").text)
    assert metrics["neffcache_blob_bytes_accel_total"] == 2 * len(data)
    assert metrics["neffcache_blob_bytes_served_total"] == 0  # no byte went through it


def test_the_server_alone_still_sends_bytes(front: Front) -> None:
    data = os.urandom(5000)
    key = upload(front, data)
    direct = get(f"{front.server}/v1/blobs/{key}")
    assert direct.content == data
    assert "x-accel-redirect" not in direct.headers
    # Only nginx's own mark asks for X-Accel-Redirect.
    asked = get(f"{front.server}/v1/blobs/{key}", **{"X-Neffcache-Accel": "on"})
    assert asked.headers["x-accel-redirect"] == f"{PREFIX}/blobs/{key[:2]}/{key}"
    assert asked.content == b""


def test_a_corrupted_blob_never_verified_is_hashed_first_and_never_sent(front: Front) -> None:
    data = os.urandom(2 * 2**20)
    key = upload(front, data)
    path = front.store.local_path(key)
    assert path is not None
    with open(path, "r+b") as f:
        f.seek(2**20)
        f.write(b"rot")
    assert get(f"{front.url}/v1/blobs/{key}").status_code == 404
    assert front.store.size(key) is None  # quarantined
    assert upload(front, data) == key  # the next upload heals it
    assert get(f"{front.url}/v1/blobs/{key}").content == data


def test_a_verified_unchanged_file_is_handed_over_unhashed_and_a_changed_one_hashed(
    front: Front, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verified, "_RACY", 0.0)  # remembered although just written
    hashed: list[str] = []
    real_verify = blob_reads.verify

    def counted(*args: object, **kwargs: object) -> object:
        hashed.append(str(args[3]))
        return real_verify(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(blob_reads, "verify", counted)
    data = os.urandom(100_000)
    key = upload(front, data)
    for _ in range(3):
        assert get(f"{front.url}/v1/blobs/{key}").content == data
    assert hashed == [key]  # the first GET only
    path = front.store.local_path(key)
    assert path is not None
    # Another file in its place (a new inode: a stamp that differs even within one
    # tick of a coarse filesystem clock, which the memo's 2 s racy window covers).
    other = path.with_name("other")
    other.write_bytes(b"\0" + data[1:])
    os.replace(other, path)
    assert get(f"{front.url}/v1/blobs/{key}").status_code == 404
    assert hashed == [key, key]


def test_blob_files_are_reachable_only_through_the_server(front: Front) -> None:
    key = upload(front, os.urandom(1000))
    assert get(f"{front.url}{PREFIX}/blobs/{key[:2]}/{key}").status_code == 404
