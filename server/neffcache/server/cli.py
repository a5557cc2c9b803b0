"""``neffcache serve`` and ``neffcache admin token ...``, registered into the
``neffcache`` command through the ``neffcache.cli`` entry point.

Importing this module is cheap (no FastAPI): the client's CLI imports it to list the
commands even where the ``server`` extra is not installed; running ``serve`` then says
which extra to install. The admin commands that ask a server need nothing beyond the
base install (they ask through the client's own HTTP, ``host.request``); those that
open the stores (``--local``, ``reindex``, ``fsck``) and ``serve`` need the whole
extra.

The host CLI hands ``register`` its server resolver and error types (``host``: the
client's ``cli/_server.py``, which this package may not import by name): every admin
command names its server and token as every other command does, and its errors map to
the same exit codes (2 bad input or a refusal, 1 a server that cannot answer).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from . import __version__, clihost

if TYPE_CHECKING:
    from .app import ServerApp
    from .settings import ServerSettings


def register(sub: Any, cli_host: Any) -> None:
    """Add the server's commands to the ``neffcache`` parser; ``cli_host`` is the host
    CLI's server resolver and error types (see the module docstring)."""
    clihost.bind(cli_host)
    serve = sub.add_parser(
        "serve", help="run the cache server", description=_SERVE_DOC, epilog=_SERVE_EXIT
    )
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8787)")
    serve.add_argument("--data-dir", help="where the embedded stores live")
    serve.add_argument("--config", help="a TOML settings file")
    serve.add_argument("--version", action="version", version=f"neffcache {__version__}")
    serve.set_defaults(run=run_serve)

    admin = sub.add_parser(
        "admin",
        help="manage a server: tokens, namespaces, pins, eviction, audit",
        description="Manage a neffcache server through its admin API (reindex and fsck "
        "open its stores directly). Each command is one request to --server with an admin "
        "--token; it prints for people, --json prints the API's answer (docs/admin.md).",
    )
    admin_sub = admin.add_subparsers(dest="admin_command", metavar="WHAT", required=True)
    token = admin_sub.add_parser(
        "token",
        help="create, list or revoke tokens",
        description="Create, list or revoke the server's tokens (needs an admin token for "
        "'*'; audited). With --local they use the server's index directly, on its host.",
    )
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = token_sub.add_parser(
        "create",
        help="create a token and print its secret once",
        description="Create a token with a scope (read < write < admin) over namespaces "
        "('*' for all) and print its record with its secret: shown this once, the server "
        'keeps only its hash (--json: the record as JSON, the secret in "token").',
    )
    create.add_argument("--scope", choices=("read", "write", "admin"), required=True)
    create.add_argument(
        "--namespace", action="append", required=True, help="repeat for several; '*' for all"
    )
    create.add_argument("--name", default="", help="who or what the token is for")
    create.add_argument(
        "--trusted",
        action="store_true",
        help="may publish into namespaces that take only trusted writers (CI's token)",
    )
    clihost.target_arguments(create, local=True)
    create.set_defaults(run=run_token_create)
    listing = token_sub.add_parser(
        "list",
        help="list tokens (never their secrets)",
        description="A table of every token (id, name, scope, namespaces, trusted, "
        "created, revoked or active), never a secret; --json prints the records.",
    )
    clihost.target_arguments(listing, local=True)
    listing.set_defaults(run=run_token_list)
    revoke = token_sub.add_parser(
        "revoke",
        help="revoke a token by id",
        description="Revoke the token with this id (as token list shows it): requests "
        "carrying it are refused from then on.",
    )
    revoke.add_argument("token_id")
    clihost.target_arguments(revoke, local=True)
    revoke.set_defaults(run=run_token_revoke)

    for parser in (create, listing, revoke):
        parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    from . import admincli

    for parser in (admin, token, create, listing, revoke):
        admincli._one_line(parser)
    admincli.register(admin_sub)
    from .recovery import commands

    commands.register(admin_sub, admincli._one_line)


_SERVE_DOC = (
    "Run the cache server. Defaults: blobs on the local filesystem and the index in "
    "SQLite, both under --data-dir. Settings come from NEFFCACHE_* variables, then "
    "--config, then defaults (docs/configuration.md)."
)
_SERVE_EXIT = (
    "Exit 2, with one line, when it cannot start: a bad setting, a store it cannot "
    "open, a port in use, the server extra not installed."
)


def run_serve(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    # The server extra's modules first: where one is missing, the host CLI says which
    # extra to install before anything else happens.
    import uvicorn  # noqa: F401

    from . import serving
    from .app import create_app  # noqa: F401

    # From the start: what opening the stores logs is shown as the server's log.
    with serving.server_logging():
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    import socket

    from . import serving
    from .auth import is_loopback
    from .banner import banner
    from .connections import ConnectionLimits

    settings, app = _open(args)
    tokens = bool(app.state.backends.index.tokens())
    if not is_loopback(settings.host) and not tokens:
        raise clihost.CommandError(
            f"refusing to listen on {settings.host} without tokens (protected mode): create "
            "an admin token first with `neffcache admin token create --local --data-dir "
            f"{settings.data_dir} --scope admin --namespace '*'`, or set "
            "NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN"
        )
    # Bound before uvicorn starts the app: a port in use is this one line, not an
    # error after "Application startup complete." (serving.py).
    try:
        sock = serving.bind(settings.host, settings.port)
    except serving.BindError as exc:
        raise clihost.CommandError(str(exc)) from None
    lines = banner(
        settings,
        port=sock.getsockname()[1],
        tokens=tokens,
        version=__version__,
        host_name=socket.getfqdn(),
    )
    print("\n".join(lines), file=sys.stderr, flush=True)
    # uvicorn alone keeps a connection that never sends a whole request head for ever,
    # and caps nothing; these close such connections and cap them (connections.py).
    limits = ConnectionLimits(settings.max_connections, settings.header_timeout_seconds)
    options = {
        "log_level": "info",
        "access_log": settings.access_log,
        "http": limits.protocol_class(answers=app.fast_path),
    }
    return serving.run(app, sock, options)


def _open(args: argparse.Namespace) -> tuple[ServerSettings, ServerApp]:
    """The settings, and the app on its opened stores; a bad setting or an unreachable
    store is a CommandError."""
    from .app import create_app
    from .config_errors import ConfigError
    from .errors import StoreError
    from .settings import load_settings

    try:
        settings = load_settings(
            host=args.host, port=args.port, data_dir=args.data_dir, config_file=args.config
        )
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return settings, create_app(settings)
    except (ConfigError, OSError, StoreError) as exc:
        raise clihost.CommandError(str(exc)) from None


def local_backends(args: argparse.Namespace) -> Any:
    """The server's stores opened on this host (``--local``; recovery/commands.py)."""
    from .recovery.commands import local_backends

    return local_backends(args)


def _out(args: argparse.Namespace, answer: Any, text: Any) -> int:
    from .admintext import out

    return out(args, answer, text)


def run_token_create(args: argparse.Namespace, extra: list[str]) -> int:
    from .admintext import token_text

    clihost.no_extra(extra)
    namespaces = tuple(args.namespace)
    if not args.local:
        body = {
            "scope": args.scope,
            "namespaces": list(namespaces),
            "name": args.name,
            "trusted": args.trusted,
        }
        return _out(args, clihost.request(args, "POST", "/v1/admin/tokens", body), token_text)
    from .errors import ServerError
    from .services.tokens import create_token, token_view

    # The index as the server opens it: the token's document is written too (recovery/).
    with local_backends(args) as backends:
        try:
            actor = f"{os.environ.get('USER', 'local')} (--local)"
            token, secret = create_token(
                backends, actor, args.scope, namespaces, args.name, trusted=args.trusted
            )
        except ServerError as exc:
            raise clihost.CommandError(str(exc)) from None
    return _out(args, {**token_view(token), "token": secret}, token_text)


def run_token_list(args: argparse.Namespace, extra: list[str]) -> int:
    from .admintext import tokens_text

    clihost.no_extra(extra)
    if not args.local:
        return _out(args, clihost.request(args, "GET", "/v1/admin/tokens"), tokens_text)
    from .services.tokens import token_views

    with local_backends(args) as backends:
        listed = {"tokens": token_views(backends)}
    return _out(args, listed, tokens_text)


def run_token_revoke(args: argparse.Namespace, extra: list[str]) -> int:
    clihost.no_extra(extra)
    if not args.local:
        clihost.request(args, "DELETE", f"/v1/admin/tokens/{args.token_id}")
    else:
        with local_backends(args) as backends:
            if not backends.index.revoke_token(args.token_id):
                raise clihost.CommandError(f"no token {args.token_id}")
    return _out(
        args,
        {"revoked": args.token_id},
        lambda a: f"revoked token {a['revoked']}: requests carrying it are refused from now on",
    )
