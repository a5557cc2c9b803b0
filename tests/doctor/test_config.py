"""Configuration: each mistake a new user makes, planted, is named with its fix; the
token and the namespace as the server sees them."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.doctor_harness import (
    StatusServer,
    TokenServer,
    doctor_env,
    results,
    said,
    status_body,
)
from support.e2e import Server

pytestmark = pytest.mark.e2e

HOST = "127.0.0.1:8787"
GOOD = f"neffcache+http://{HOST}/team-a"


@pytest.mark.parametrize(
    ("variables", "found", "fix"),
    [
        pytest.param(
            {"NEFFCACHE_URL": f"neffcache://{HOST}/team-a"},
            "only neffcache+http:// or neffcache+https://",
            f"NEFFCACHE_URL={GOOD}",
            id="neffcache-scheme",
        ),
        pytest.param(
            {"NEURON_COMPILE_CACHE_URL": f"http://{HOST}/team-a"},
            "the SDK knows (it takes it for a directory)",
            f"NEURON_COMPILE_CACHE_URL={GOOD}",
            id="http-as-sdk-url",
        ),
        pytest.param(
            {"NEURON_CC_FLAGS": f"--model-type=transformer --cache-dir={GOOD}"},
            "has --cache-dir: libneuronxla reads only --cache_dir",
            f"--cache_dir={GOOD}",
            id="cache-dir-hyphen",
        ),
        pytest.param(
            {"NEURON_CC_FLAGS": f"--model-type=transformer {GOOD}"},
            "NEURON_CC_FLAGS holds a bare URL",
            f"NEFFCACHE_URL={GOOD}",
            id="bare-url-in-flags",
        ),
        pytest.param(
            {"NEFFCACHE_URL": f'"{GOOD}"'},
            "NEFFCACHE_URL is in quotes, which are part of the value",
            f"NEFFCACHE_URL={GOOD} (no quotes",
            id="quoted-value",
        ),
        pytest.param(
            {"NEFFCACHE_URI": GOOD},
            "NEFFCACHE_URI is set, and neffcache does not read it",
            "NEFFCACHE_URL=",
            id="misspelled-name",
        ),
    ],
)
def test_a_mistyped_setting_is_named_with_its_fix(
    tmp_path: Path, variables: dict[str, str], found: str, fix: str
) -> None:
    code, checks = results(doctor_env(tmp_path, **variables), "--only", "config")
    typos = checks["config.typos"]
    assert typos["status"] == "FAIL", typos
    assert found in typos["evidence"]
    assert typos["fix"].startswith(fix), typos["fix"]
    # The mistake leaves neffcache off, and config.url says so.
    assert checks["config.url"]["status"] == "FAIL"
    assert code == 1


def test_a_mistake_beside_a_working_url_is_a_warning(server: Server, tmp_path: Path) -> None:
    url = server.cache_url("doctor-beside")
    env = doctor_env(tmp_path, url, NEURON_COMPILE_CACHE_URL=url.removeprefix("neffcache+"))
    code, checks = results(env, "--only", "config")
    assert checks["config.url"]["status"] == "PASS"
    assert checks["config.typos"]["status"] == "WARN"
    assert "NEURON_COMPILE_CACHE_URL=neffcache+http://" in checks["config.typos"]["fix"]
    assert code == 0


def test_no_url_at_all_says_how_to_set_one(tmp_path: Path) -> None:
    code, checks = results(doctor_env(tmp_path), "--only", "config")
    url = checks["config.url"]
    assert url["status"] == "FAIL"
    assert "neffcache is off" in url["evidence"]
    assert "export NEFFCACHE_URL=neffcache+http://HOST:8787/NAMESPACE" in url["fix"]
    assert "compiler_cache_url" in url["fix"]  # a URL set later, by a launcher
    assert checks["config.token"]["status"] == "SKIP"
    assert code == 1


def test_no_token_for_a_server_that_requires_one(token_server: TokenServer, tmp_path: Path) -> None:
    code, checks = results(doctor_env(tmp_path, token_server.url("team-a")), "--only", "config")
    token = checks["config.token"]
    assert token["status"] == "FAIL", token
    assert "requires a token and NEFFCACHE_TOKEN is not set" in token["evidence"]
    assert "set NEFFCACHE_TOKEN" in token["fix"]
    assert "neffcache admin token create --scope write --namespace team-a" in token["fix"]
    assert code == 1


def test_an_unknown_token_is_refused(token_server: TokenServer, tmp_path: Path) -> None:
    env = doctor_env(tmp_path, token_server.url("team-a"), NEFFCACHE_TOKEN="nfc_not_a_token")
    code, checks = results(env, "--only", "config")
    assert checks["config.token"]["status"] == "FAIL"
    assert "refused NEFFCACHE_TOKEN" in checks["config.token"]["evidence"]
    assert code == 1


def test_a_token_for_another_namespace(token_server: TokenServer, tmp_path: Path) -> None:
    env = doctor_env(tmp_path, token_server.url("team-b"), NEFFCACHE_TOKEN=token_server.writer)
    code, checks = results(env, "--only", "config", "--only", "server")
    token = checks["config.token"]
    assert token["status"] == "FAIL", token
    assert "covers team-a, not team-b" in token["evidence"]
    assert "use a token for team-b" in token["fix"]
    assert token["data"]["namespaces"] == ["team-a"]
    assert checks["server.round-trip"]["status"] == "FAIL"
    assert code == 1


def test_a_read_only_token_warns_and_writes_nothing(
    token_server: TokenServer, tmp_path: Path
) -> None:
    env = doctor_env(tmp_path, token_server.url("team-a"), NEFFCACHE_TOKEN=token_server.reader)
    code, checks = results(env, "--only", "config", "--only", "server")
    token = checks["config.token"]
    assert token["status"] == "WARN", token
    assert "read-only" in token["evidence"]
    assert "never publishes" in token["evidence"]
    assert "a write token for team-a" in token["fix"]
    trip = checks["server.round-trip"]
    assert trip["status"] == "PASS", trip
    assert trip["data"]["write"] == "skipped"
    assert checks["server.reach"]["evidence"].endswith(" ms")
    assert "tokens required" in checks["server.reach"]["evidence"]
    assert code == 0  # warnings alone do not fail


def test_a_write_token_passes_and_the_round_trip_writes(
    token_server: TokenServer, tmp_path: Path
) -> None:
    env = doctor_env(tmp_path, token_server.url("team-a"), NEFFCACHE_TOKEN=token_server.writer)
    code, checks = results(env, "--only", "config", "--only", "server")
    assert checks["config.token"]["status"] == "PASS", checks["config.token"]
    assert checks["config.token"]["evidence"].endswith(": write on team-a")
    assert checks["server.round-trip"]["data"]["write"] == "ok"
    assert checks["server.round-trip"]["evidence"].startswith("uploaded, published and read back")
    assert code == 0


def test_a_namespace_that_does_not_exist(status_server: StatusServer, tmp_path: Path) -> None:
    status_server.body = status_body("team-typo", exists=False, entries=0, bytes=0)
    env = doctor_env(tmp_path, status_server.url("team-typo"))
    checks = results(env, "--only", "config")[1]
    namespace = checks["config.namespace"]
    assert namespace["status"] == "WARN"
    assert "namespace team-typo does not exist yet" in namespace["evidence"]
    assert "check its spelling in the URL" in namespace["fix"]


def test_a_namespace_for_trusted_writers_only(status_server: StatusServer, tmp_path: Path) -> None:
    status_server.body = status_body(
        "team-a", policy={"trusted_writers_only": True, "ttl_seconds": 604800}
    )
    checks = results(doctor_env(tmp_path, status_server.url("team-a")), "--only", "config")[1]
    namespace = checks["config.namespace"]
    assert namespace["status"] == "WARN"
    assert "takes only trusted writers" in namespace["evidence"]
    assert "policy ttl_seconds: 604800" in said(namespace)


def test_a_url_without_a_namespace_is_named_with_the_fix(tmp_path: Path) -> None:
    env = doctor_env(tmp_path, f"neffcache+http://{HOST}")
    code, checks = results(env, "--only", "config")
    url = checks["config.url"]
    assert url["status"] == "FAIL", url
    assert "the client cannot use its settings" in url["evidence"]
    assert "the URL must end with one namespace name" in url["fix"]
    assert code == 1


def test_neffcache_disabled(server: Server, tmp_path: Path) -> None:
    env = doctor_env(tmp_path, server.cache_url("doctor-off"), NEFFCACHE_DISABLE="1")
    code, checks = results(env, "--only", "config", "--only", "server", "--read-only")
    assert checks["config.url"]["status"] == "FAIL"
    assert checks["config.url"]["fix"] == "unset NEFFCACHE_DISABLE"
    # The server is checked all the same.
    assert checks["server.reach"]["status"] == "PASS"
    assert code == 1
