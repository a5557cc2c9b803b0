"""Eviction against real ``neffcache serve`` processes: a download in flight when its entry
is evicted, one evicting replica at a time (SQLite file and Redis index shared by two
servers), and the admin commands end to end (run through the CLI's entry point in this
process, against a real server; two of them through the installed command)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import free_port
from support.backends import backends
from support.served import (
    NEFFCACHE,
    Server,
    actor_pid,
    digest,
    evictions,
    key,
    neff,
    publish,
    until,
    without_settings,
)

from neffcache.client.cli import main

MIB = 2**20


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start servers (``start(data_dir, **NEFFCACHE_settings)``); all are killed at the end."""
    started: list[Server] = []

    def start(data_dir: Path, **settings: str) -> Server:
        server = Server(data_dir, settings)  # its log beside data_dir: in tmp_path
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.kill()


# --- downloads in flight ----------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("verified_before", [False, True], ids=["first-read", "verified-blob"])
def test_a_download_in_flight_completes_when_its_entry_is_evicted(
    servers: Callable[..., Server], tmp_path: Path, verified_before: bool
) -> None:
    """A 40 MiB blob (streamed, never read whole) is being downloaded when its only entry
    is expired and a pass with no grace period removes the blob: the download that
    had begun still completes, byte for byte. Both ways a blob is streamed: on its
    first read (hashed as it goes) and once verified (sent unhashed, its file's stamp
    checked before the last chunk)."""
    server = servers(
        tmp_path / "data",
        NEFFCACHE_EVICTION_INTERVAL_SECONDS="0",
        NEFFCACHE_BLOB_GRACE_SECONDS="0",
    )
    data = os.urandom(40 * MIB)
    blob = digest(data)
    with server.client() as client, server.client() as admin:
        published = publish(
            client, "team-a", key(1), data, components={"compiler_version": "2.20.1"}
        )
        assert published.status_code == 201, published.text
        if verified_before:
            time.sleep(2.2)  # older than verified.py's "racily clean" window
            whole = client.get(f"/v1/blobs/{blob}")
            assert whole.status_code == 200
            assert digest(whole.content) == blob
        received = bytearray()
        with client.stream("GET", f"/v1/blobs/{blob}") as response:
            assert response.status_code == 200
            chunks = response.iter_bytes()
            for chunk in chunks:
                received += chunk
                if len(received) >= MIB:
                    break
            expired = admin.post("/v1/admin/expire", json={"compiler_version": "2.20.*"})
            assert expired.json()["total"]["entries"] == 1, expired.text
            swept = admin.post("/v1/admin/evict", json={"dry_run": False})
            assert swept.status_code == 200, swept.text
            assert swept.json()["blobs_collected"] == 1
            assert admin.head(f"/v1/blobs/{blob}").status_code == 404
            try:
                for chunk in chunks:
                    received += chunk
            except httpx.HTTPError as exc:
                pytest.fail(
                    f"the download was cut off after {len(received)} of {len(data)} bytes: "
                    f"{exc!r}; server log: {server.log.read_text()[-1500:]}"
                )
    assert len(received) == len(data)
    assert digest(bytes(received)) == blob


# --- one evicting replica ---------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("index", backends("sqlite", "redis"))
def test_one_replica_evicts_at_a_time_and_another_takes_over(
    servers: Callable[..., Server],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    index: str,
) -> None:
    # The default blob grace (an hour): with none, a pass on one replica may collect a
    # blob uploaded through the other before its entry is published, as the grace is
    # there to prevent, and the publish is told the blob is missing.
    settings = {"NEFFCACHE_EVICTION_INTERVAL_SECONDS": "1"}
    if index == "sqlite":
        dirs = [tmp_path / "shared", tmp_path / "shared"]  # one data dir: one SQLite file
    else:
        import redis

        url = request.getfixturevalue("redis_server")
        with redis.Redis.from_url(url) as connection:
            connection.flushdb()
        settings["NEFFCACHE_INDEX_URL"] = url
        settings["NEFFCACHE_BLOB_URL"] = (tmp_path / "blobs").as_uri()
        dirs = [tmp_path / "one", tmp_path / "two"]
    first = servers(dirs[0], **settings)
    second = servers(dirs[1], **settings)
    by_pid = {first.pid: first, second.pid: second}
    with first.client() as a, second.client() as b:
        made = a.post("/v1/admin/namespaces/q", json={"quota_bytes": 3000})
        assert made.status_code == 201, made.text
        for i, client in enumerate((a, b, a, b)):
            done = publish(client, "q", key(i), neff(f"replica {i}", 1000), compile_seconds=60)
            assert done.status_code == 201, done.text
        until(lambda: len(evictions(a)) >= 2, 30, "the quota was not applied")
        time.sleep(1.5)  # a few more passes: none may remove anything more
        records = evictions(a)
        assert len(records) == 2
        assert {r["namespace"] for r in records} == {"q"}
        pids = {actor_pid(r) for r in records}
        assert len(pids) == 1, records
        (leader_pid,) = pids
        assert leader_pid in by_pid
        leader = by_pid[leader_pid]
        follower = second if leader is first else first
        actor = records[0]["actor"]
        with follower.client() as f, leader.client() as lead:
            refused = f.post("/v1/admin/evict", json={"dry_run": False})
            assert refused.status_code == 409
            assert actor in refused.json()["detail"]
            assert lead.post("/v1/admin/evict", json={"dry_run": False}).status_code == 200
            # Dry runs are anyone's (they change nothing).
            assert f.post("/v1/admin/evict", json={"dry_run": True}).status_code == 200

            leader.kill()
            for i in range(4, 6):
                done = publish(f, "q", key(i), neff(f"replica {i}", 1000), compile_seconds=60)
                assert done.status_code == 201, done.text

            def taken_over() -> bool:
                return any(actor_pid(r) == follower.pid for r in evictions(f))

            # Once the killed evictor's lease has run out; 30 s only ends the wait.
            until(taken_over, 30, "no replica took over from the killed evictor")
            records = evictions(f)
            assert all(actor_pid(r) in (leader_pid, follower.pid) for r in records)
            # One at a time: each of the follower's passes came after the leader's last.
            led = max(r["at"] for r in records if actor_pid(r) == leader_pid)
            assert all(r["at"] >= led for r in records if actor_pid(r) == follower.pid)
            assert f.post("/v1/admin/evict", json={"dry_run": False}).status_code == 200
            left = f.get("/v1/ns/q/entries").json()["entries"]
            assert sum(e["files"]["model.neff"]["size"] for e in left) <= 3000


# --- the admin commands -----------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed command, in a process of its own."""
    return subprocess.run(
        [*NEFFCACHE, *args],
        capture_output=True,
        text=True,
        env=without_settings(os.environ),
        timeout=60,
        check=False,
    )


class InProcess:
    """``neffcache ARGS`` through the CLI's entry point in this process (a subprocess
    per command costs the interpreter's start-up each time), its exit code and output
    captured as a subprocess's would be."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's way out (a bad input, exit 2)
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        captured = self.capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> InProcess:
    # No NEFFCACHE_* a developer may have set: the commands are told --server and
    # --token, as without_settings() leaves a subprocess.
    for name in [n for n in os.environ if n.startswith("NEFFCACHE_")]:
        monkeypatch.delenv(name)
    return InProcess(capsys)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(done))


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for word in words:
        assert word in done.stderr
    return done.stderr


@pytest.mark.e2e
def test_the_admin_commands_end_to_end(
    servers: Callable[..., Server], tmp_path: Path, in_process: InProcess
) -> None:
    data = tmp_path / "data"
    # The installed command, once on the server's host (--local) ...
    made = cli(
        "admin", "token", "create", "--local", "--data-dir", str(data),
        "--scope", "admin", "--namespace", "*", "--name", "ops", "--json",
    )  # fmt: skip
    admin = json.loads(ok(made))
    label = f"{admin['token_id']} (ops)"
    server = servers(
        data, NEFFCACHE_EVICTION_INTERVAL_SECONDS="0", NEFFCACHE_BLOB_GRACE_SECONDS="0"
    )
    target = ("--server", server.url, "--token", admin["token"])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return in_process("admin", *args, *target)

    created = ok(
        run("namespace", "create", "team-a", "--ttl", "7d", "--quota", "1G",
            "--keep-compiler-versions", "2")
    )  # fmt: skip
    assert "team-a" in created
    assert "7d since last use" in created
    assert "1.0 GiB" in created
    assert "2 kept" in created
    team_b = as_json(run("namespace", "create", "team-b", "--ttl", "12h", "--json"))
    assert team_b["ttl_seconds"] == 12 * 3600
    assert team_b["created"] is True
    shown = as_json(run("namespace", "show", "team-a", "--json"))
    assert (shown["ttl_seconds"], shown["quota_bytes"], shown["compiler_versions"]) == (
        7 * 86400,
        2**30,
        2,
    )
    assert shown["usage"]["entries"] == 0
    lifted = as_json(run("namespace", "set", "team-a", "--quota", "none", "--json"))
    assert lifted["quota_bytes"] is None
    assert lifted["ttl_seconds"] == 7 * 86400
    # ... and once against the server.
    listing = ok(cli("admin", "namespace", "list", *target))
    assert listing.splitlines()[0].split() == [
        "NAMESPACE",
        "ENTRIES",
        "BYTES",
        "QUOTA",
        "TTL",
        "WRITERS",
    ]
    assert {line.split()[0] for line in listing.splitlines()[1:]} == {"team-a", "team-b"}
    listed = as_json(run("namespace", "list", "--json"))
    assert [ns["namespace"] for ns in listed["namespaces"]] == ["team-a", "team-b"]

    with server.client(admin["token"]) as client:
        version = {"compiler_version": "2.20.1"}
        for name, seconds in (("long", 5400), ("short", 1800)):
            done = publish(
                client, "team-a", key(name), neff(name, 800),
                compile_seconds=seconds, components=version,
            )  # fmt: skip
            assert done.status_code == 201, done.text

        pinned = ok(run("pin", "team-a", "--key", key("long"), "--reason", "release 7"))
        assert f"pinned key {key('long')} in team-a" in pinned
        pins = as_json(run("pins", "team-a", "--json"))["pins"]
        assert [(p["kind"], p["value"], p["reason"]) for p in pins] == [
            ("key", key("long"), "release 7")
        ]
        assert pins[0]["actor"] == label
        assert key("long") in ok(run("pins", "team-a"))
        assert "unpinned" in ok(run("unpin", "team-a", "--key", key("long")))
        assert ok(run("pins", "team-a")).strip() == "no pins in team-a"

        ok(run("namespace", "set", "team-a", "--quota", "1000"))
        dry = ok(run("evict", "--dry-run"))
        assert (
            "would remove 1 entries, 800 B, worth 30m of compile time (0.50 compile-hours)" in dry
        )
        assert key("short")[:16] in dry
        dry_json = as_json(run("evict", "--dry-run", "--json"))
        assert dry_json["total"]["bytes"] == 800
        assert dry_json["total"]["compile_hours"] == 0.5
        assert [e["key"] for e in dry_json["entries"]] == [key("short")]
        assert client.get(f"/v1/ns/team-a/entries/{key('short')}").status_code == 200

        swept = ok(run("evict"))
        assert "removed 1 entries, 800 B, worth 30m of compile time (0.50 compile-hours)" in swept
        assert "blobs collected: 1" in swept
        assert client.get(f"/v1/ns/team-a/entries/{key('short')}").status_code == 404

        would = as_json(run("expire", "--compiler-version", "2.20.*", "--dry-run", "--json"))
        assert [e["key"] for e in would["entries"]] == [key("long")]
        assert client.get(f"/v1/ns/team-a/entries/{key('long')}").status_code == 200
        expired = ok(run("expire", "--compiler-version", "2.20.*"))
        assert (
            "removed 1 entries, 800 B, worth 1.5h of compile time (1.50 compile-hours)" in expired
        )
        assert client.get(f"/v1/ns/team-a/entries/{key('long')}").status_code == 404

    # Trusted writers: a namespace that takes only them, CI's token and another.
    main = as_json(run("namespace", "create", "main", "--trusted-writers-only", "--json"))
    assert main["trusted_writers_only"] is True
    dev = as_json(run("namespace", "create", "dev", "--read-through", "main", "--json"))
    assert dev["read_through"] == ["main"]
    ci = as_json(run("token", "create", "--scope", "write", "--namespace", "main",
                     "--name", "ci", "--trusted", "--json"))  # fmt: skip
    branch = as_json(run("token", "create", "--scope", "write", "--namespace", "main",
                         "--namespace", "dev", "--name", "branch", "--json"))  # fmt: skip
    assert (ci["trusted"], branch["trusted"]) == (True, False)
    with server.client(ci["token"]) as as_ci, server.client(branch["token"]) as as_branch:
        assert publish(as_ci, "main", key("ci"), neff("ci", 100)).status_code == 201
        refused = publish(as_branch, "main", key("branch"), neff("branch", 100))
        assert refused.status_code == 403
        assert publish(as_branch, "dev", key("branch"), neff("branch", 100)).status_code == 201
        through = as_branch.get(f"/v1/ns/dev/entries/{key('ci')}")
        assert through.json()["namespace"] == "main"

    records = as_json(run("audit", "--since", "1h", "--json"))["records"]
    actions = sorted(r["action"] for r in records if r["actor"] == label)
    assert actions == sorted(
        ["namespace.create"] * 4 + ["namespace.set"] * 2 + ["token.create"] * 2
        + ["pin", "unpin", "evict", "expire"]
    )  # fmt: skip
    tokens = {r["target"]: r["detail"] for r in records if r["action"] == "token.create"}
    assert tokens[ci["token_id"]]["trusted"] is True
    assert tokens[branch["token_id"]]["trusted"] is False
    text = ok(run("audit", "--since", "1h"))
    assert text.splitlines()[0].split() == ["WHEN", "WHO", "ACTION", "NAMESPACE", "WHAT", "WHY"]
    assert "evict" in text
    assert "expire" in text
    only_b = as_json(run("audit", "--since", "1h", "--namespace", "team-b", "--json"))["records"]
    assert [(r["action"], r["namespace"]) for r in only_b] == [("namespace.create", "team-b")]
    assert as_json(run("audit", "--since", "2099-01-01", "--json"))["records"] == []

    # Refusals from the server: one line each, exit 2.
    one_line_error(run("namespace", "create", "team-a"), "409")
    one_line_error(run("namespace", "set", "team-c", "--quota", "1G"), "404")
    one_line_error(run("namespace", "set", "team-a"), "at least one setting")
    one_line_error(run("namespace", "set", "team-a", "--ttl", "10s"), "ttl_seconds")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["namespace", "create", "team-c", "--ttl", "5x"], ["5x"]),
        (["namespace", "create", "team-c", "--quota", "-1"], ["-1"]),
        (["namespace", "set", "team-c", "--quota=-1"], ["-1"]),
        (["namespace", "set", "team-c", "--keep-compiler-versions", "0"], ["0"]),
        (["audit", "--since", "last tuesday"], ["last tuesday"]),
    ],
    ids=["ttl-5x", "quota-minus-1", "quota-equals-minus-1", "keep-0", "since-words"],
)
def test_bad_admin_inputs_are_one_line_and_exit_2(
    args: list[str], words: list[str], in_process: InProcess
) -> None:
    # Nothing listens there: a bad input must be caught before any request.
    done = in_process("admin", *args, "--server", f"http://127.0.0.1:{free_port()}")
    err = one_line_error(done, *words)
    assert "cannot reach" not in err
