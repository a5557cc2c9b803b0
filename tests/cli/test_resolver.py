"""The one resolver every command names its server with (``cli/_server.py``): the two
URL forms, where each part comes from and in what order, the old spellings with their
one line each, and the exit code main() gives each kind of trouble."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from neffcache.client.cli import _key_cmd, _server, main
from neffcache.client.cli._common import CommandError, MissingExtra, ServerUnavailable


def args(**given: Any) -> argparse.Namespace:
    """Parsed options as a command with every server option would have them."""
    names = ("server", "deprecated_url", "namespace", "token")
    return argparse.Namespace(command="test", **{name: given.get(name) for name in names})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://cache.internal:8787", ("http://cache.internal:8787", None)),
        ("https://cache.internal/", ("https://cache.internal", None)),
        ("neffcache+http://h:1/team-a", ("http://h:1", "team-a")),
        ("neffcache+https://h/team-a/", ("https://h", "team-a")),
    ],
)
def test_either_form_names_a_server(url: str, expected: tuple[str, str | None]) -> None:
    assert _server.parse(url, "--server") == expected


@pytest.mark.parametrize(
    "url",
    [
        "neffcache://h:1/team-a",  # the scheme without its transport
        "neffcache+http://h:1",  # the client's form without its namespace
        "neffcache+http://h:1/Team A",
        "neffcache+ftp://h/team-a",
        "http://h:port",
        "http://",
        "cache.internal:8787",
        "",
    ],
)
def test_other_forms_are_one_line_naming_both(url: str) -> None:
    with pytest.raises(CommandError) as raised:
        _server.parse(url, "NEFFCACHE_URL")
    message = str(raised.value)
    assert message.startswith(f"NEFFCACHE_URL {url!r}: use http://HOST:PORT or ")
    assert "neffcache+http://HOST:PORT/NAMESPACE" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("http://h:1/team-a", "/team-a"),  # any path in the plain form
        ("https://h/neffcache/", "/neffcache"),
        ("neffcache+http://h:1/neffcache/team-a", "/neffcache"),
        ("neffcache+https://h/a/b/team-a/", "/a/b"),
    ],
)
def test_a_path_prefix_is_one_line_naming_it(url: str, prefix: str) -> None:
    with pytest.raises(CommandError) as raised:
        _server.parse(url, "NEFFCACHE_URL")
    message = str(raised.value)
    assert message.startswith(f"NEFFCACHE_URL {url!r}: a path after HOST:PORT ({prefix!r}) ")
    assert message.endswith(
        "use http://HOST:PORT or neffcache+http://HOST:PORT/NAMESPACE (https too)"
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("given", "env", "server"),
    [
        ({"server": "http://opt:1"}, {"NEFFCACHE_URL": "http://env:2"}, "http://opt:1"),
        ({}, {"NEFFCACHE_URL": "http://env:2", "NEFFCACHE_SERVER": "http://old:3"}, "http://env:2"),
        ({}, {"NEFFCACHE_URL": "neffcache+http://env:2/a"}, "http://env:2"),
        # libneuronxla's own settings, when they hold the client's form.
        ({}, {"NEURON_COMPILE_CACHE_URL": "neffcache+http://sdk:4/a"}, "http://sdk:4"),
        ({}, {"NEURON_CC_FLAGS": "--cache_dir=neffcache+http://flags:5/a"}, "http://flags:5"),
        # ... not a stock cache's directory, which names no server.
        ({}, {"NEURON_COMPILE_CACHE_URL": "/var/tmp/neuron-cache"}, _server.DEFAULT_SERVER),
        ({}, {}, _server.DEFAULT_SERVER),
    ],
)
def test_where_the_server_comes_from(
    given: dict[str, str], env: dict[str, str], server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _server.resolve(args(**given), env, namespace=False).server == server


def test_the_namespace_is_the_options_else_the_urls() -> None:
    env = {"NEFFCACHE_URL": "neffcache+http://h:1/from-url"}
    assert _server.resolve(args(), env, namespace=True).namespace == "from-url"
    chosen = _server.resolve(args(namespace="mine"), env, namespace=True)
    assert (chosen.server, chosen.namespace) == ("http://h:1", "mine")
    assert chosen.url == "neffcache+http://h:1/mine"
    # A command without a namespace of its own leaves its --namespace alone.
    assert _server.resolve(args(namespace="filter"), env, namespace=False).namespace == "from-url"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"server": "http://h:1"}, "no namespace: pass --namespace NS or --server neffcache+"),
        ({"server": "http://h:1", "namespace": "Bad Name"}, "--namespace 'Bad Name' is not a"),
    ],
)
def test_a_namespace_the_command_needs_is_checked(given: dict[str, str], said: str) -> None:
    with pytest.raises(CommandError, match=said):
        _server.resolve(args(**given), {}, namespace=True)


def test_the_token_is_the_options_else_the_environments() -> None:
    env = {"NEFFCACHE_TOKEN": "from-env"}
    assert _server.resolve(args(token="from-option"), env, namespace=False).token == "from-option"
    assert _server.resolve(args(), env, namespace=False).token == "from-env"
    assert _server.resolve(args(), {}, namespace=False).token is None


@pytest.mark.parametrize(
    ("given", "env", "expected", "warning"),
    [
        (
            {"deprecated_url": "http://old:1"},
            {},
            ("http://old:1", None),
            "--url is deprecated: use --server",
        ),
        (
            {"deprecated_url": "http://old:1", "server": "http://new:2"},
            {},
            ("http://new:2", None),
            "--url is deprecated and ignored (--server is given): use --server",
        ),
        (
            {},
            {"NEFFCACHE_SERVER": "http://old:1"},
            ("http://old:1", None),
            "NEFFCACHE_SERVER is deprecated: use --server URL, or "
            "NEFFCACHE_URL=neffcache+http://HOST:PORT/NAMESPACE",
        ),
        (
            {},
            {"NEFFCACHE_ADMIN_TOKEN": "old"},
            (_server.DEFAULT_SERVER, "old"),
            "NEFFCACHE_ADMIN_TOKEN is deprecated: use NEFFCACHE_TOKEN",
        ),
        (
            {},
            {"NEFFCACHE_ADMIN_TOKEN": "old", "NEFFCACHE_TOKEN": "new"},
            (_server.DEFAULT_SERVER, "new"),
            "NEFFCACHE_ADMIN_TOKEN is deprecated and ignored (NEFFCACHE_TOKEN is given): "
            "use NEFFCACHE_TOKEN",
        ),
    ],
)
def test_an_old_spelling_still_works_and_says_the_new_one(
    given: dict[str, str],
    env: dict[str, str],
    expected: tuple[str, str | None],
    warning: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = _server.resolve(args(**given), env, namespace=False)
    assert (target.server, target.token) == expected
    assert capsys.readouterr().err == f"neffcache test: warning: {warning}\n"


def test_a_server_is_optional_only_where_the_command_says() -> None:
    assert _server.configured(args(), {}, namespace=True) is None
    assert _server.configured(args(), {"NEURON_COMPILE_CACHE_URL": "/dir"}, namespace=True) is None
    found = _server.configured(args(), {"NEFFCACHE_URL": "neffcache+http://h:1/a"}, namespace=True)
    assert found is not None
    assert found.namespace == "a"
    with pytest.raises(CommandError):  # named, so it must be usable
        _server.configured(args(server="http://h:1"), {}, namespace=True)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, CommandError),
        (401, CommandError),
        (403, CommandError),
        (404, CommandError),
        (409, CommandError),
        (408, ServerUnavailable),
        (429, ServerUnavailable),
        (500, ServerUnavailable),
        (503, ServerUnavailable),
        (302, ServerUnavailable),
    ],
)
def test_a_refusal_is_bad_input_and_anything_else_no_answer(
    status: int, kind: type[Exception]
) -> None:
    error = _server.answer_error("http://h:1", status, "why")
    assert type(error) is kind
    assert str(error) == f"http://h:1 answered {status}: why"


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (CommandError("bad"), 2, "neffcache key: error: bad"),
        (ServerUnavailable("cannot reach it"), 1, "neffcache key: cannot reach it"),
        (
            MissingExtra(),
            2,
            "neffcache key: needs the server extra: pip install 'neffcache[server]'",
        ),
        (
            ModuleNotFoundError("No module named 'fastapi'", name="fastapi"),
            2,
            "neffcache key: needs the server extra: pip install 'neffcache[server]'",
        ),
        (KeyboardInterrupt(), 130, "neffcache key: interrupted"),
    ],
)
def test_main_gives_each_kind_of_trouble_one_line_and_its_code(
    raised: BaseException,
    code: int,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(args: argparse.Namespace, extra: list[str]) -> int:
        raise raised

    monkeypatch.setattr(_key_cmd, "run", run)
    assert main(["key", "x.pb"]) == code
    assert capsys.readouterr() == ("", f"{line}\n")


def test_a_module_missing_for_another_reason_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(args: argparse.Namespace, extra: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'neffcache.gone'", name="neffcache.gone")

    monkeypatch.setattr(_key_cmd, "run", run)
    with pytest.raises(ModuleNotFoundError):
        main(["key", "x.pb"])
