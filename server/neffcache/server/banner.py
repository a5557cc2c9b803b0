"""What ``neffcache serve`` prints once as it starts: its version, where its data is,
the URL clients set, who may use it, and where the dashboard is.

A pure function of the settings and what start-up found, so the text in
docs/operations.md is checked against it. Store URLs are redacted (their passwords
and queries may hold keys), and no token's secret is known here.
"""

from __future__ import annotations

from neffcache.server.settings import ServerSettings, redact

NAMESPACE = "<namespace>"
# Addresses that mean every interface: no client can reach the server by them.
WILDCARDS = frozenset({"0.0.0.0", "::"})
_ELSEWHERE = "HOST"


def _first_token_command(base_url: str) -> str:
    """The command that ends protected mode on a running server (anonymous callers are
    admins until then, so it needs no token)."""
    return f"neffcache admin token create --server {base_url} --scope admin --namespace '*'"


def banner(
    settings: ServerSettings, *, port: int, tokens: bool, version: str, host_name: str
) -> list[str]:
    """The lines to print. ``port`` is the one bound (``settings.port`` may be 0);
    ``host_name`` this host's name, shown when clients cannot use the bound address."""
    wildcard = settings.host in WILDCARDS
    authority = f"{_ELSEWHERE if wildcard else _url_host(settings.host)}:{port}"
    rows = _data(settings)
    rows.append(("clients", f"NEFFCACHE_URL=neffcache+http://{authority}/{NAMESPACE}"))
    if wildcard:
        where = f"{_ELSEWHERE}: this host's name or address as clients reach it"
        rows.append(("", f"{where} (here: {host_name})"))
    if tokens:
        rows.append(("auth", "tokens: every request needs one (clients: NEFFCACHE_TOKEN)"))
    else:
        rows.append(("auth", "open: this server has no token, so anyone who can reach it on"))
        rows.append(("", "this host is an admin (it listens on loopback only). To require"))
        rows.append(("", f"tokens: {_first_token_command(f'http://{authority}')}"))
    rows.append(("dashboard", f"http://{authority}/"))
    listening = f"{_url_host(settings.host)}:{port}"
    return [f"neffcache {version} on {listening}", *(f"  {k:<10} {v}" for k, v in rows)]


def _data(settings: ServerSettings) -> list[tuple[str, str]]:
    """The data directory, or the stores' URLs when either is set apart from it."""
    if settings.blob_url is None and settings.index_url is None:
        return [("data", str(settings.data_dir))]
    return [
        ("blobs", redact(settings.blob_store_url())),
        ("index", redact(settings.index_store_url())),
    ]


def _url_host(host: str) -> str:
    """A host as a URL names it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
