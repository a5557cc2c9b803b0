"""``neffcache explain KEY`` or ``neffcache explain HLO_FILE [--compiler-version V]
[--target T] [-- FLAG ...]``

Asks the server why a graph missed: the nearest graphs it knows, component by
component, what removed an entry, the last failed compile. KEY is a key the server
heard of (a client's miss, a failure record); a stock address (as the SDK's logs and
the run manifest name a graph), a stock entry or one of L1's manifests is turned into
its key first; an HLO file is keyed here with the same options as ``neffcache key``,
and its components and graph summary are sent. Plain
words first; ``--json`` prints the server's answer. The server, token and default
namespace come from the environment a training job uses (``NEFFCACHE_URL``,
``NEFFCACHE_TOKEN``), or from --server, --namespace and --token. Exit 0 with an
explanation, 1 when the server cannot answer, 2 on bad input or a request the server
refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from neffcache.client.config import ClientConfig

from . import _server
from ._common import CommandError, ServerUnavailable, help_text

if TYPE_CHECKING:
    from neffcache.client.api import Api
    from neffcache.client.http import Response
from ._key_cmd import add_compile_options, module_key, read_module

# Explanations read the index and may parse a stored module: more than a lookup.
_TIMEOUT = 60.0
# Requests stay under the server's 8 MiB: past this the shapes are left out.
_BODY_MAX = 6 * 2**20
# The server takes an instruction's shape up to this many characters (a tuple of
# tuples prints longer): past it, the shapes are left out rather than refused.
_SHAPE_MAX = 4096
LOG_LINES = 30


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "explain",
        help="why a graph missed: the nearest graphs the server knows, and what differs",
        description=help_text(__doc__),
        usage="neffcache explain KEY | STOCK_ADDRESS | ENTRY | HLO_FILE [--compiler-version V] "
        "[--target T] "
        "[--server URL] [--namespace NS] [--token TOKEN] [--json] [-- FLAG ...]",
    )
    parser.add_argument(
        "what",
        metavar="KEY|ADDRESS|HLO_FILE",
        help="a 64-hex cache key; a stock address (neuronxcc-<ver>/MODULE_<key>+<flags8>, "
        "with or without its version folder or a file after it); a stock entry or an L1 "
        "manifest on this host; or a serialized HloModuleProto",
    )
    add_compile_options(parser)
    _server.add_options(parser, namespace=True)
    parser.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, flags: list[str]) -> int:
    config = _server.client_config(_server.resolve(args, namespace=True))
    from neffcache.client.explain_target import resolve_target

    # Compiler options describe an HLO_FILE: given them, a file is read as one even
    # inside a stock entry, rather than turned into the entry's key.
    options = bool(flags or args.compiler_version or args.target)
    key = None if options and os.path.isfile(args.what) else resolve_target(args.what, os.environ)
    if key is not None:
        if options:
            raise CommandError("a KEY takes no compiler options: they describe an HLO_FILE")
        body = None
    else:
        body = _request(read_module(args.what), args, flags, config)
    answer = _ask(config, key, body)
    if args.json:
        json.dump(answer, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(answer))
    return 0


def _request(
    module: bytes, args: argparse.Namespace, flags: list[str], config: ClientConfig
) -> bytes:
    from neffcache.keying import graph_summary

    canonical, _ = module_key(module, args, flags)
    request: dict[str, Any] = {
        "key": canonical.key,
        "components": canonical.as_json(),
        "graph": graph_summary(module).as_json(shapes_max=None),
    }
    if config.model:
        request["model"] = config.model
    shapes = request["graph"]["shapes"]
    if any(len(shape) > _SHAPE_MAX for shape in shapes):
        del request["graph"]["shapes"]
    body = json.dumps(request).encode()
    if len(body) > _BODY_MAX and "shapes" in request["graph"]:  # a huge graph
        del request["graph"]["shapes"]
        body = json.dumps(request).encode()
    return body


def _ask(config: ClientConfig, key: str | None, body: bytes | None) -> dict[str, Any]:
    """The server's explanation of ``key`` (``GET``), or of the graph ``body`` describes
    (``POST``)."""
    from neffcache.protocol import routes

    def send(api: Api) -> Response:
        if key is not None:
            return api.get(api.explain_key_path(key))
        path = routes.explain_path(config.namespace)
        headers = {"Content-Type": "application/json"}
        return api.request("POST", path, headers=headers, body=body)

    response = _server.ask(
        config.server,
        config.namespace,
        config.token,
        send,
        connect_timeout=config.connect_timeout,
        timeout=max(config.timeout, _TIMEOUT),
    )
    try:
        answer = json.loads(response.body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ServerUnavailable(f"{config.server} answered with something other than JSON")
    return answer


# --- plain words


def render(answer: dict[str, Any]) -> str:
    """An explanation for people: the summary first, then what supports it."""
    lines = [str(answer.get("summary", "")), ""]
    lines.append(f"reason: {answer.get('reason')}")
    key = answer.get("key")
    lines.append(f"key: {key or '(not computed)'}  namespace: {answer.get('namespace')}")
    sentences = answer.get("sentences") or []
    if sentences:
        lines.append("")
        lines += [f"- {sentence}" for sentence in sentences]
    lines += _entry(answer.get("entry"))
    lines += _removed(answer.get("removed"))
    lines += _graph(answer.get("graph"))
    lines += _nearest(answer.get("nearest") or [])
    lines += _failure(answer.get("failure"))
    return "\n".join(lines) + "\n"


def _when(at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def _entry(entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return []
    return [
        "",
        f"entry: {entry.get('key')} in {entry.get('namespace')}, published "
        f"{_when(entry.get('created_at'))} by {entry.get('writer')}",
    ]


def _removed(removed: Any) -> list[str]:
    if not isinstance(removed, dict):
        return []
    lines = [
        "",
        f"removed: {_when(removed.get('at'))} from {removed.get('namespace')}, "
        f"{removed.get('action')} ({removed.get('reason')}) by {removed.get('actor')}",
    ]
    if removed.get("why"):
        lines.append(f"  {removed['why']}")
    return lines


def _graph(graph: Any) -> list[str]:
    if not isinstance(graph, dict):
        return []
    differing = graph.get("differing")
    head = f"closest graph: {graph.get('fingerprint')} (same {graph.get('relation')})"
    lines = ["", head]
    if isinstance(differing, int):
        lines.append(f"  {differing} of {graph.get('instructions')} instructions' shapes differ")
    for example in graph.get("examples") or []:
        lines.append(
            f"  #{example.get('instruction')}: {example.get('theirs')} -> {example.get('yours')}"
        )
    return lines


def _nearest(nearest: list[Any]) -> list[str]:
    if not nearest:
        return []
    lines = ["", "nearest graphs the server knows (theirs vs yours):"]
    for item in nearest:
        if not isinstance(item, dict):
            continue
        present = item.get("present")
        state = "entry present" if present is True else "no entry now" if present is False else ""
        about = ", ".join(
            part
            for part in (
                f"namespace {item.get('namespace')}",
                state,
                str(item.get("seen") or ""),
                f"{_when(item.get('created_at'))}",
                f"model {item['model']}" if item.get("model") else "",
            )
            if part
        )
        lines.append(f"  {str(item.get('key'))[:16]}  {about}")
        for diff in item.get("differences") or []:
            lines.append(
                f"    {diff.get('component')}: {_value(diff.get('theirs'))} vs "
                f"{_value(diff.get('yours'))}"
            )
    return lines


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _failure(failure: Any) -> list[str]:
    if not isinstance(failure, dict):
        return []
    lines = ["", f"last failure: {_when(failure.get('created_at'))}"]
    for name in ("compiler_version", "exit_code", "compile_seconds", "host", "job_id"):
        if name in failure:
            lines.append(f"  {name}: {failure[name]}")
    log = failure.get("log")
    if isinstance(log, str) and log:
        tail = log.rstrip("\n").split("\n")[-LOG_LINES:]
        lines.append(f"  log (last {len(tail)} lines):")
        lines += [f"    {line}" for line in tail]
    return lines
