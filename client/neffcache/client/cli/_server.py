"""How every ``neffcache`` command names its server, namespace and token: one way.

    --server URL    http(s)://HOST:PORT, or neffcache+http(s)://HOST:PORT/NAMESPACE;
                    else NEFFCACHE_URL, the job's own setting (else libneuronxla's
                    forms when they hold a neffcache+ URL: ``--cache_dir`` in
                    NEURON_CC_FLAGS, NEURON_COMPILE_CACHE_URL; config.cache_url);
                    else http://127.0.0.1:8787
    --namespace NS  where a command needs one; else the URL's
    --token TOKEN   else NEFFCACHE_TOKEN

A path between HOST:PORT and the namespace (a reverse proxy's prefix, as in
http://host/neffcache) is refused with one line naming it, by every command alike: the
runtime client refuses it too (``config.parse_url``), and a server the commands could
reach there would be one no job could.

The old spellings still work, each with one line on stderr naming the new one, so that
scripts do not break silently: ``--url`` (for ``--server``), ``NEFFCACHE_SERVER`` (for
``NEFFCACHE_URL``) and ``NEFFCACHE_ADMIN_TOKEN`` (for ``NEFFCACHE_TOKEN``). Where both
spellings are given the new one wins, and the line says the old one is ignored.

The server's commands (``serve``, ``admin``) receive this module as ``host`` when
they register (``register(sub, host)``): the server package may not import the
client, and this is how they share its resolver, its error types and its one
request (``request``, over the client's API client). The bridge's
(``import``, ``export``) register the same way.
The standard library only: the client's CLI runs in training images.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from neffcache.client.config import (
    SCHEME_PREFIX,
    ClientConfig,
    ConfigError,
    cache_url,
    parse_url,
)
from neffcache.protocol import is_namespace

from ._common import CommandError, MissingExtra, ServerUnavailable, one_line

if TYPE_CHECKING:
    from neffcache.client.api import Api
    from neffcache.client.http import Response

__all__ = [
    "DEFAULT_SERVER",
    "CommandError",
    "MissingExtra",
    "ServerUnavailable",
    "Target",
    "add_options",
    "answer_error",
    "ask",
    "client_config",
    "configured",
    "one_line",
    "parse",
    "request",
    "resolve",
]

DEFAULT_SERVER = "http://127.0.0.1:8787"
FORMS = "http://HOST:PORT or neffcache+http://HOST:PORT/NAMESPACE (https too)"
_NAMESPACE_RULE = "lowercase letters, digits, '.', '_', '-' (at most 63)"
_PLAIN = re.compile(r"https?://[^/\s?#@]+/?")
# A server's answers that say it cannot answer now, rather than that it refuses the
# request: a timeout and a rate limit are 4xx, and so exit 1 with the 5xx.
_NOT_A_REFUSAL = frozenset({408, 429})
EXIT_CODES = (
    "Exit 1 when the server cannot answer (not reached, a timeout, a 5xx, an answer "
    "that is not one), 2 on bad input, including a request the server refuses (a 4xx); "
    "docs/configuration.md."
)


class Target(NamedTuple):
    """A server as a command asks it."""

    server: str  # http(s)://host:port, no trailing slash
    namespace: str | None  # None for commands that take none from the URL
    token: str | None

    @property
    def url(self) -> str:
        """The client's form, ``neffcache+http://host:port/namespace``."""
        return f"{SCHEME_PREFIX}{self.server}/{self.namespace}"


def add_options(
    parser: argparse.ArgumentParser,
    *,
    namespace: bool,
    token_help: str = "a token (default: NEFFCACHE_TOKEN)",
    default: Any = None,
) -> None:
    """``--server``, ``--namespace`` (when the command takes its namespace from the
    URL), ``--token``, the hidden ``--url``, and an epilog saying where each comes from
    and what the exit codes mean. ``default``: ``argparse.SUPPRESS`` on a subcommand
    that keeps what its parent was given (``report upgrade``)."""
    parser.add_argument(
        "--server",
        metavar="URL",
        default=default,
        help="http(s)://HOST:PORT or neffcache+http(s)://HOST:PORT/NAMESPACE "
        f"(default: NEFFCACHE_URL, else {DEFAULT_SERVER})",
    )
    parser.add_argument("--url", dest="deprecated_url", default=default, help=argparse.SUPPRESS)
    if namespace:
        parser.add_argument(
            "--namespace",
            metavar="NS",
            default=default,
            help="the namespace (default: the one in the server's URL)",
        )
    parser.add_argument("--token", metavar="TOKEN", default=default, help=token_help)
    if parser.epilog is None:
        parser.epilog = epilog(namespace=namespace)


def epilog(*, namespace: bool) -> str:
    names = " The namespace: --namespace, else the URL's." if namespace else ""
    return (
        "The server: --server, else NEFFCACHE_URL, else "
        f"{DEFAULT_SERVER}.{names} The token: --token, else NEFFCACHE_TOKEN. {EXIT_CODES}"
    )


def resolve(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None, *, namespace: bool
) -> Target:
    """The server, namespace and token ``args`` and the environment name, by the module
    docstring's order; ``namespace``: the command needs one (CommandError without)."""
    env = os.environ if environ is None else environ
    command = _command(args)
    given = _url(args, env, command)
    url, origin = given if given is not None else (DEFAULT_SERVER, "the default server")
    server, from_url = parse(url, origin)
    chosen = _namespace(args, from_url) if namespace else from_url
    return Target(server, chosen, _token(args, env, command))


def configured(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None, *, namespace: bool
) -> Target | None:
    """As ``resolve``, or None when neither an option nor the environment names a
    server (for commands where the server's part is optional: ``stats``)."""
    env = os.environ if environ is None else environ
    named = (namespace and getattr(args, "namespace", None)) or _url(
        args, env, _command(args), quiet=True
    )
    return resolve(args, env, namespace=namespace) if named else None


def parse(url: str, origin: str) -> tuple[str, str | None]:
    """(``http(s)://host:port``, the namespace or None) of a server URL in either form;
    CommandError naming the accepted forms otherwise, and a path prefix by name."""
    prefix = _path_prefix(url)
    if prefix is not None:
        raise CommandError(
            f"{origin} {url!r}: a path after HOST:PORT ({prefix!r}) is not supported: "
            "neffcache asks the server at the root of its host and port, as jobs do (no "
            f"path prefix: behind a reverse proxy, give it a host or port of its own); use {FORMS}"
        )
    if url.startswith(SCHEME_PREFIX):
        try:
            return parse_url(url)  # the client's own parser: one definition of the form
        except ConfigError:
            rule = f"; a NAMESPACE is {_NAMESPACE_RULE}" if "://" in url else ""
            raise CommandError(f"{origin} {url!r}: use {FORMS}{rule}") from None
    if _PLAIN.fullmatch(url) and _has_host_and_port(url):
        return url.rstrip("/"), None
    raise CommandError(f"{origin} {url!r}: use {FORMS}")


def client_config(
    target: Target, environ: Mapping[str, str] | None = None, *, local_dir: str | None = None
) -> ClientConfig:
    """The client configuration a job would have with this target (its timeouts, L1,
    model label ...), as the commands that run the client's code need it."""
    env = dict(os.environ if environ is None else environ)
    env["NEFFCACHE_URL"] = target.url
    env.pop("NEFFCACHE_DISABLE", None)  # the command asks for the server by name
    env.pop("NEFFCACHE_TOKEN", None)
    if target.token:
        env["NEFFCACHE_TOKEN"] = target.token
    if local_dir:
        env["NEFFCACHE_LOCAL_DIR"] = local_dir
    try:
        config = ClientConfig.from_env(env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    if config is None:  # cannot be: the URL is the client's form and nothing disables it
        raise CommandError(f"cannot use {target.url}")
    return config


_ANSWER_LIMIT = 256 << 20


def ask(
    server: str,
    namespace: str,
    token: str | None,
    send: Callable[[Api], Response],
    *,
    connect_timeout: float,
    timeout: float,
    statuses: Container[int] = (200,),
) -> Response:
    """A command's one request: ``send`` on a new ``api.Api`` to ``server``, and its
    answer when its status is one of ``statuses``. ServerUnavailable (exit 1) when no
    answer came; for another status, ``answer_error``'s exception."""
    from neffcache.client.api import Api
    from neffcache.client.http import HttpError, error_detail

    try:
        api = Api.open(server, namespace, token, connect_timeout=connect_timeout, timeout=timeout)
        try:
            answer = send(api)
        finally:
            api.close()
    except HttpError as exc:
        raise ServerUnavailable(f"cannot reach {server}: {exc}") from None
    if answer.status not in statuses:
        raise answer_error(server, answer.status, error_detail(answer.body))
    return answer


def request(
    args: argparse.Namespace, method: str, path: str, body: Any = None, timeout: float = 10.0
) -> Any:
    """One request to the server ``args`` name (``ask``), for a command: its JSON
    answer (None for an empty one). A refusal is a CommandError (exit 2); no answer,
    or one that is not JSON, ServerUnavailable (exit 1). The server's remote ``admin``
    commands ask through this (``clihost``)."""
    import json

    target = resolve(args, namespace=False)
    answer = ask(
        target.server,
        "",
        target.token,
        # A listing (tokens, audit) may be long: more than the runtime's cap.
        lambda api: api.request(method, path, json_body=body, limit=_ANSWER_LIMIT),
        connect_timeout=timeout,
        timeout=timeout,
        statuses=range(200, 300),
    )
    try:
        return json.loads(answer.body) if answer.body else None
    except ValueError:
        raise ServerUnavailable(
            f"{target.server} answered with something other than JSON"
        ) from None


def answer_error(server: str, status: int, detail: str) -> Exception:
    """The error for an answer other than the one asked for: a refusal (a 4xx: a bad
    value, a token the server does not take, something that does not exist) is bad
    input, exit 2; anything else means the server cannot answer, exit 1."""
    message = f"{server} answered {status}: {detail}"
    if 400 <= status < 500 and status not in _NOT_A_REFUSAL:
        return CommandError(message)
    return ServerUnavailable(message)


# --- where each comes from


def _command(args: argparse.Namespace) -> str:
    return str(getattr(args, "command", None) or "")


def _url(
    args: argparse.Namespace, env: Mapping[str, str], command: str, *, quiet: bool = False
) -> tuple[str, str] | None:
    """(the URL, where it came from), or None for the default server."""
    option = getattr(args, "server", None)
    old = getattr(args, "deprecated_url", None)
    if old is not None and not quiet:
        _deprecated(command, "--url", "--server", ignored=option is not None)
    if option is not None or old is not None:
        return str(option if option is not None else old), "--server"
    if env.get("NEFFCACHE_URL"):
        if env.get("NEFFCACHE_SERVER") and not quiet:
            _deprecated(command, "NEFFCACHE_SERVER", "NEFFCACHE_URL", ignored=True)
        return env["NEFFCACHE_URL"], "NEFFCACHE_URL"
    if env.get("NEFFCACHE_SERVER"):
        if not quiet:
            # Not NEFFCACHE_URL=http://...: that variable is a job's too, and a job
            # needs the neffcache+ form with its namespace (_typos.py says so).
            _deprecated(command, "NEFFCACHE_SERVER", _SERVER_INSTEAD)
        return env["NEFFCACHE_SERVER"], "NEFFCACHE_SERVER"
    sdk = cache_url(env)  # libneuronxla's own settings, which may name a stock cache
    if sdk and sdk.startswith(SCHEME_PREFIX):
        origin = "NEURON_COMPILE_CACHE_URL"
        if env.get(origin) != sdk:
            origin = "--cache_dir in NEURON_CC_FLAGS"
        return sdk, origin
    return None


def _namespace(args: argparse.Namespace, from_url: str | None) -> str:
    chosen = getattr(args, "namespace", None) or from_url
    if chosen is None:
        raise CommandError(
            "no namespace: pass --namespace NS or --server "
            "neffcache+http://HOST:PORT/NAMESPACE, or set NEFFCACHE_URL to that"
        )
    if not is_namespace(chosen):
        raise CommandError(f"--namespace {chosen!r} is not a namespace name: {_NAMESPACE_RULE}")
    return str(chosen)


def _token(args: argparse.Namespace, env: Mapping[str, str], command: str) -> str | None:
    option = getattr(args, "token", None)
    if option:
        return str(option)
    new, old = env.get("NEFFCACHE_TOKEN"), env.get("NEFFCACHE_ADMIN_TOKEN")
    if old:
        _deprecated(command, "NEFFCACHE_ADMIN_TOKEN", "NEFFCACHE_TOKEN", ignored=bool(new))
    return new or old or None


_SERVER_INSTEAD = "--server URL, or NEFFCACHE_URL=neffcache+http://HOST:PORT/NAMESPACE"


def _deprecated(command: str, old: str, new: str, *, ignored: bool = False) -> None:
    state = f"deprecated and ignored ({new} is given)" if ignored else "deprecated"
    print(f"neffcache {command}: warning: {old} is {state}: use {new}", file=sys.stderr)


def _path_prefix(url: str) -> str | None:
    """The path between HOST:PORT and the namespace (``/neffcache`` in
    ``neffcache+http://host/neffcache/team-a``, or any path of a plain ``http://``
    URL), or None. Refused rather than followed: the runtime client takes none
    (``config.parse_url``), so a prefix the commands accepted would reach a server that
    no job of the same URL can."""
    plain = not url.startswith(SCHEME_PREFIX)
    scheme, sep, rest = url.removeprefix(SCHEME_PREFIX).partition("://")
    if not sep or scheme not in ("http", "https") or any(c in rest for c in "?#"):
        return None  # not a URL of either form: parse's own message says so
    parts = [part for part in rest.split("/")[1:] if part]
    kept = parts if plain else parts[:-1]
    return "/" + "/".join(kept) if kept else None


def _has_host_and_port(url: str) -> bool:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 -- raises ValueError for a port that is not one
    except ValueError:
        return False
    return bool(parts.hostname)
