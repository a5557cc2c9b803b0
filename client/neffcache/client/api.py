"""The server's HTTP API as one client: the protocol's paths, the token, JSON.

Every part of the client that asks a server goes through ``Api``: the runtime
(``remote.Remote``, one ``Api`` per thread), prewarm (``Remote``'s subclass), the
commands that ask a server (``report``, ``explain``, ``stats``), ``doctor``'s server
checks and the bridge (``import``, ``export``). ``Api`` sends and returns: a status
is an answer for the caller to read, and trouble on the way is ``http.HttpError``
(``http.ConnectFailed`` when no connection could be opened). What each caller makes
of trouble is its own policy, and stays with it: the runtime turns it into a miss and
backs off (a job never waits on the cache), a command into one line and an exit code,
the bridge into a stopped run or a skipped entry.

Paths come from ``neffcache.protocol.routes``; the few a runtime never asks for are
built here from its prefixes. Importing this module costs what ``http`` costs: the
shim's hit path imports it.
"""

from __future__ import annotations

from typing import Any

from neffcache.client.http import BODY_LIMIT, Connection, Response
from neffcache.protocol import routes


class Api:
    """One server and namespace, over one ``Connection`` (not thread-safe: one per
    thread). ``token``: sent as a bearer token on every request but ``auth=False``.

    >>> api = Api(Connection("http://cache.internal:8787", 5.0, 10.0), "team-a", None)
    >>> api.namespace
    'team-a'
    """

    __slots__ = ("connection", "headers", "namespace")

    def __init__(self, connection: Connection, namespace: str, token: str | None) -> None:
        self.connection = connection
        self.namespace = namespace
        self.headers = {"Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def open(
        cls,
        server: str,
        namespace: str,
        token: str | None,
        *,
        connect_timeout: float,
        timeout: float,
    ) -> Api:
        """An ``Api`` on a new connection to ``server``; ``HttpError`` for a URL that
        is not ``http(s)://host[:port]``."""
        return cls(Connection(server, connect_timeout, timeout), namespace, token)

    def close(self) -> None:
        self.connection.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
        **kwargs: Any,
    ) -> Response:
        """One request (``http.Connection.request``'s keywords: ``body``,
        ``body_file``, ``sink``, ``timeout``, ``wait``, ``limit``); ``json_body`` is
        sent as JSON. Any status is returned; ``HttpError`` when there was none."""
        sent = dict(self.headers) if auth else {"Accept": "application/json"}
        if headers:
            sent.update(headers)
        if json_body is not None:
            import json  # here: the shim's hit path sends no JSON

            sent["Content-Type"] = "application/json"
            kwargs["body"] = json.dumps(json_body).encode()
        return self.connection.request(method, path, headers=sent, **kwargs)

    def get(self, path: str, *, limit: int = BODY_LIMIT, **kwargs: Any) -> Response:
        return self.request("GET", path, limit=limit, **kwargs)

    # -- paths beyond the runtime's (protocol.routes has those) -------------------------

    def status_path(self, *, namespace: bool = True, window: float | None = None) -> str:
        """``GET /v1/status``, with this namespace's part unless ``namespace`` is False."""
        query = {"namespace": self.namespace} if namespace else {}
        if window is not None:
            query["window"] = f"{window:g}"
        return _with_query(routes.STATUS, query)

    def explain_key_path(self, key: str) -> str:
        """``GET`` the explanation of a key the server has seen."""
        return f"{routes.explain_path(self.namespace)}/{key}"

    def entry_aliases_path(self, key: str) -> str:
        return f"{routes.entry_path(self.namespace, key)}/aliases"

    def entries_page_path(self, limit: int, after: str | None = None) -> str:
        query: dict[str, str] = {"limit": str(limit)}
        if after is not None:
            query["after"] = after
        return _with_query(routes.entries_path(self.namespace), query)


def report_path(name: str, query: dict[str, Any]) -> str:
    """``GET /v1/reports/{name}`` (``cost``, ``upgrade``) with ``query``: reports are
    server-wide, so no namespace."""
    return _with_query(f"{routes.API}/reports/{name}", query)


def _with_query(path: str, query: dict[str, Any]) -> str:
    if not query:
        return path
    from urllib.parse import urlencode  # here: only the commands send a query

    return f"{path}?{urlencode(query, doseq=True)}"
