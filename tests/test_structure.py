"""Package structure (STYLE.md section 7, rule 8): one PEP 420 namespace over three
source roots, imports that only point the allowed way, and complete public APIs."""

from __future__ import annotations

import ast
import functools
import importlib
import re
import subprocess
import sys
import types
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("keying", "client", "server")

# What keying may import besides the standard library and itself: the two
# dependencies every Neuron training image already has.
KEYING_THIRD_PARTY = ("blake3", "google.protobuf")
# The wire protocol, shared by every side: it ships in keying's source root (so in the
# base install) and imports only the standard library.
PROTOCOL = "neffcache.protocol"
# The client goes into training images that pin their own stacks.
CLIENT_FORBIDDEN = (
    "neffcache.server",
    "fastapi",
    "pydantic",
    "pydantic_settings",
    "redis",
    "boto3",
    "botocore",
    "starlette",
    "uvicorn",
    "prometheus_client",
)
# Except here: the bridge's S3 source imports boto3 inside its functions, only for
# `neffcache import s3://...` (the `s3` extra); nothing the hook or the shim loads.
CLIENT_EXTRAS = {"neffcache.client.bridge.s3": ("boto3", "botocore")}
SERVER_FORBIDDEN = ("neffcache.client",)


def source_files(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


def module_name(path: Path, package: str) -> str:
    parts = list(path.relative_to(ROOT / package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool) -> set[str]:
    """Absolute names of every module ``source`` imports, at any depth in the file."""
    return imported_by(ast.parse(source), module, is_package=is_package)


def imported_by(tree: ast.AST, module: str, *, is_package: bool) -> set[str]:
    """``imported_modules`` of a parsed tree (or of a part of one)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                # Resolve "from ..x import y" against the importing module's package.
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            # "from pkg import sub" may import a submodule.
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def imports_of(package: str) -> dict[str, set[str]]:
    result = {}
    for path in source_files(package):
        module = module_name(path, package)
        result[module] = imported_modules(
            path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py"
        )
    return result


def within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def is_stdlib(name: str) -> bool:
    return name.partition(".")[0] in sys.stdlib_module_names


# --- (1) one namespace, three roots ---------------------------------------------------


@pytest.mark.parametrize("package", PACKAGES)
def test_no_namespace_init(package: str) -> None:
    assert (ROOT / package / "neffcache").is_dir()
    assert not (ROOT / package / "neffcache" / "__init__.py").exists()
    assert (ROOT / package / "neffcache" / package / "__init__.py").is_file()


def test_no_top_level_neffcache_folder() -> None:
    assert not (ROOT / "neffcache").exists()


# --- (2) import direction -------------------------------------------------------------


def test_import_resolution_helper() -> None:
    # The checks below are only as good as this resolver.
    found = imported_modules(
        "import os.path\nfrom . import _x\nfrom ._y import z\nfrom .. import other\n"
        "def f():\n    import fastapi\n",
        "neffcache.keying._mod",
        is_package=False,
    )
    assert found >= {
        "os.path",
        "neffcache.keying",
        "neffcache.keying._x",
        "neffcache.keying._y",
        "neffcache",
        "neffcache.other",
        "fastapi",
    }
    package_init = imported_modules(
        "from ._cmd import run", "neffcache.client.cli", is_package=True
    )
    assert "neffcache.client.cli._cmd" in package_init


def test_keying_imports_only_stdlib_blake3_protobuf_protocol_and_itself() -> None:
    allowed = ("neffcache.keying", PROTOCOL, *KEYING_THIRD_PARTY)
    bad = {
        module: sorted(name for name in names if not (is_stdlib(name) or within(name, allowed)))
        for module, names in imports_of("keying").items()
        if not within(module, (PROTOCOL,))
    }
    assert {module: names for module, names in bad.items() if names} == {}


def test_protocol_imports_only_stdlib_and_itself() -> None:
    # The client imports it in every training process, and the server's pydantic
    # models are checked against it: nothing it imports may need an install.
    found = {m: n for m, n in imports_of("keying").items() if within(m, (PROTOCOL,))}
    assert "neffcache.protocol.manifest" in found  # the scan sees the package
    bad = {
        module: sorted(name for name in names if not (is_stdlib(name) or within(name, (PROTOCOL,))))
        for module, names in found.items()
    }
    assert {module: names for module, names in bad.items() if names} == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_side_may_import_the_protocol(package: str) -> None:
    # Not vacuous: each side's scan does see its use of the shared protocol.
    assert any(
        within(name, (PROTOCOL,))
        for module, names in imports_of(package).items()
        if not within(module, (PROTOCOL,))
        for name in names
    )


def test_client_imports_no_server_stack() -> None:
    bad = {
        module: sorted(
            name
            for name in names
            if within(name, CLIENT_FORBIDDEN) and not within(name, CLIENT_EXTRAS.get(module, ()))
        )
        for module, names in imports_of("client").items()
    }
    assert {module: names for module, names in bad.items() if names} == {}


def test_client_imports_only_stdlib_keying_blake3_and_itself() -> None:
    # The .pth hook runs in every Python process of a training image: nothing it can
    # reach may add a dependency beyond what the base install brings.
    allowed = ("neffcache.client", "neffcache.keying", PROTOCOL, "blake3")
    bad = {
        module: sorted(
            name
            for name in names
            if not (is_stdlib(name) or within(name, (*allowed, *CLIENT_EXTRAS.get(module, ()))))
        )
        for module, names in imports_of("client").items()
    }
    assert {module: names for module, names in bad.items() if names} == {}


def test_client_imports_keying() -> None:
    # Not vacuous: the scan does see the client's real dependency on keying.
    assert any(
        within(name, ("neffcache.keying",))
        for names in imports_of("client").values()
        for name in names
    )


def test_server_imports_nothing_from_client() -> None:
    bad = {
        module: sorted(name for name in names if within(name, SERVER_FORBIDDEN))
        for module, names in imports_of("server").items()
    }
    assert {module: names for module, names in bad.items() if names} == {}


def test_forbidden_import_would_be_caught() -> None:
    names = imported_modules(
        "from neffcache.server import create_app\nimport pydantic.v1\n",
        "neffcache.client._x",
        is_package=False,
    )
    assert any(within(name, CLIENT_FORBIDDEN) for name in names)
    assert sorted(n for n in names if within(n, CLIENT_FORBIDDEN)) == [
        "neffcache.server",
        "neffcache.server.create_app",
        "pydantic.v1",
    ]


# --- (3) __all__ ----------------------------------------------------------------------


def isort_style(name: str) -> tuple[int, str]:
    """ruff RUF022's order: SCREAMING_CASE, then CamelCase, then everything else."""
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_sorted_unique_and_complete(package: str) -> None:
    module = importlib.import_module(f"neffcache.{package}")
    exported = module.__all__
    assert isinstance(exported, list)
    assert exported == sorted(exported, key=isort_style), "__all__ is not sorted"
    assert len(exported) == len(set(exported)), "__all__ has duplicates"

    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == [], f"__all__ names that do not exist: {missing}"

    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and type(value).__module__ != "__future__"  # `from __future__ import annotations`
    }
    unlisted = sorted(public - set(exported))
    assert unlisted == [], f"public names missing from __all__: {unlisted}"


def test_keying_exports_the_core_api() -> None:
    keying = importlib.import_module("neffcache.keying")
    for name in ("compute_key", "CacheKey", "KeyInputs", "KEY_VERSION", "KeyingError"):
        assert name in keying.__all__


# --- (4) typed ------------------------------------------------------------------------


@pytest.mark.parametrize("package", PACKAGES)
def test_py_typed(package: str) -> None:
    assert (ROOT / package / "neffcache" / package / "py.typed").is_file()


# --- (5) self-contained citations -----------------------------------------------------

# The Neuron SDK internals the code relies on are recorded in docs/neuron-sdk.md. The
# research notes that page was written from are not in the repository, so a citation of
# them (by file name, or as "facts" and a section sign, wrapped or not) leads nowhere.
EXTERNAL_NOTES = re.compile(rb"neuron-cache-fact[s]|facts[\s#*]*\xc2\xa7", re.IGNORECASE)


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"git ls-files failed: {exc}")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def external_note_lines(text: bytes) -> list[int]:
    return [text.count(b"\n", 0, m.start()) + 1 for m in EXTERNAL_NOTES.finditer(text)]


def test_no_tracked_file_cites_the_external_sdk_notes() -> None:
    assert external_note_lines("x\n(Facts\n    # \u00a74.3)".encode()) == [2]
    files = [path for path in tracked_files() if path.is_file()]
    assert Path(__file__).resolve() in files
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line in external_note_lines(path.read_bytes())
    ]
    assert found == [], "cite docs/neuron-sdk.md#<anchor> instead:\n" + "\n".join(found)


# --- (6) citations of docs/neuron-sdk.md that resolve ---------------------------------

SDK_PAGE = "docs/neuron-sdk.md"
# An explicit citation of a section: the page's name, "#" and the section's anchor.
SDK_CITATION = re.compile(r"neuron-sdk\.md#([\w-]+)")
# A bare anchor continuing a citation ("… and #b", "(#b)"), read only in files that name
# the page and are not Markdown (there "#b" is an in-page link): a lower-case word with a
# hyphen or underscore after a line start, a space or "(", as no comment marker is.
BARE_ANCHOR = re.compile(r"(?:^|(?<=[\s(]))#([a-z][a-z0-9]*(?:[-_][a-z0-9]+)+)\b", re.MULTILINE)
# The page's links to its own sections.
PAGE_LINK = re.compile(r"\]\(#([\w-]+)\)")
ATX_HEADING = re.compile(r"#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*")
FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")


def toc_slug(title: str) -> str:
    """The id mkdocs' default toc gives a heading: a link's text only, ASCII, lower-case,
    punctuation other than "-" and "_" dropped, runs of spaces and hyphens one "-"."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_anchors(markdown: str) -> set[str]:
    """Every heading's id; a repeated one gets "_1", "_2"… as toc numbers it."""
    anchors: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := ATX_HEADING.fullmatch(line)):
            slug, number = toc_slug(heading[1]), 0
            while slug in anchors or not slug:
                number += 1
                slug = f"{toc_slug(heading[1])}_{number}"
            anchors.add(slug)
    return anchors


def cited_sdk_anchors(name: str, text: str) -> list[tuple[int, str]]:
    """(line, anchor) of each section of the page that ``text``, the file ``name``, cites."""
    patterns = [SDK_CITATION]
    if name == SDK_PAGE:
        patterns.append(PAGE_LINK)
    elif not name.endswith(".md") and "neuron-sdk.md" in text:
        patterns.append(BARE_ANCHOR)
    found = [(m.start(), m[1]) for pattern in patterns for m in pattern.finditer(text)]
    return sorted((text.count("\n", 0, start) + 1, anchor) for start, anchor in found)


def test_toc_slugs_and_citations_are_read_as_mkdocs_and_the_code_write_them() -> None:
    assert toc_slug("`neuronx-cc --version` output") == "neuronx-cc-version-output"
    assert toc_slug("optimum-neuron's registry") == "optimum-neurons-registry"
    assert toc_slug("The SDK in late 2026 (TorchNeuron, vLLM Neuron)") == (
        "the-sdk-in-late-2026-torchneuron-vllm-neuron"
    )
    page = "# A `b_c`\n```\n# not a heading\n```\n## A b_c ##\n### [Link](x.md)\n"
    assert heading_anchors(page) == {"a-b_c", "a-b_c_1", "link"}
    # \x23 is "#", so that this file cites no section itself.
    text = 'docs/neuron-sdk.md\x23a-1 and\n    # \x23b_c, (\x23d-e) x\x23f-g "\x23h-i" \x23j'
    assert cited_sdk_anchors("x.py", text) == [(1, "a-1"), (2, "b_c"), (2, "d-e")]
    assert cited_sdk_anchors("x.md", text) == [(1, "a-1")]
    assert cited_sdk_anchors(SDK_PAGE, "[up](\x23a-1) [x](\x23b)") == [(1, "a-1"), (1, "b")]


def test_every_cited_sdk_section_is_a_heading_of_the_page() -> None:
    anchors = heading_anchors((ROOT / SDK_PAGE).read_text(encoding="utf-8"))
    assert {"module_key", "layout-eras", "neuron_parallel_compiles-environment"} <= anchors
    found = [
        f"{path.relative_to(ROOT)}:{line}: #{anchor}"
        for path in tracked_files()
        if path.is_file() and b"neuron-sdk.md" in (raw := path.read_bytes())
        for line, anchor in cited_sdk_anchors(
            path.relative_to(ROOT).as_posix(), raw.decode("utf-8", "replace")
        )
        if anchor not in anchors
    ]
    assert found == [], f"no such heading in {SDK_PAGE}:\n" + "\n".join(found)


# --- (7) layers: the HTTP layer above the services ------------------------------------

# The HTTP layer: the only modules that may import FastAPI, Starlette or the dependency
# module (deps.py). Everything else in the server (the services, the stores, the
# background workers, the CLI, fsck) runs without them (docs/architecture.md#layers).
HTTP_LAYER = (
    "neffcache.server.api",  # the routes
    "neffcache.server.app",  # the FastAPI application and its error handlers
    "neffcache.server.deps",  # the routes' dependencies: the Services and the caller
    "neffcache.server.fastpath",  # ASGI middleware answering the hottest GETs
    "neffcache.server.connections",  # uvicorn's HTTP protocol with connection limits
    "neffcache.server.immediate",  # that protocol answering lookups itself
    "neffcache.server.serving",  # binds the socket and runs uvicorn
)
HTTP_STACK = ("fastapi", "starlette", "neffcache.server.deps")
# What starts the server sits above the HTTP layer and may import it (never the HTTP
# stack itself): `neffcache serve` builds the app, and the package's lazy create_app.
ENTRY_POINTS = {"neffcache.server", "neffcache.server.cli"}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(body: list[ast.stmt], *, deferred: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs: those at module level (inside ``if``, ``try``,
    ``with`` and class bodies too), never those under ``if TYPE_CHECKING``; with
    ``deferred``, also those inside functions, which run when the function does."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not is_type_checking(node.test):
                found += import_nodes(node.body + node.orelse, deferred=deferred)
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            parts = node.body + handlers + node.orelse + node.finalbody
            found += import_nodes(parts, deferred=deferred)
        elif isinstance(node, (ast.With, ast.ClassDef)) or (
            deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ):
            found += import_nodes(node.body, deferred=deferred)
    return found


@functools.cache
def runtime_imports(
    source: str, module: str, *, is_package: bool, deferred: bool
) -> frozenset[str]:
    """``imported_modules`` of the imports a module runs (``import_nodes``); cached,
    since the layer and cycle checks read every module more than once."""
    nodes = import_nodes(ast.parse(source).body, deferred=deferred)
    return frozenset(
        imported_by(ast.Module(body=list(nodes), type_ignores=[]), module, is_package=is_package)
    )


def sources_of(package: str) -> dict[str, tuple[str, bool]]:
    return {
        module_name(path, package): (path.read_text(encoding="utf-8"), path.name == "__init__.py")
        for path in source_files(package)
    }


def layer_violations(sources: dict[str, tuple[str, bool]]) -> dict[str, list[str]]:
    bad = {}
    for module, (source, is_package) in sources.items():
        if within(module, HTTP_LAYER):
            continue
        above = HTTP_STACK if module in ENTRY_POINTS else (*HTTP_STACK, *HTTP_LAYER)
        names = runtime_imports(source, module, is_package=is_package, deferred=True)
        found = sorted(name for name in names if within(name, above))
        if found:
            bad[module] = found
    return bad


def test_only_the_http_layer_imports_fastapi_starlette_deps_or_the_http_layer() -> None:
    assert layer_violations(sources_of("server")) == {}


def test_layer_rule_would_catch_a_service_importing_the_http_stack() -> None:
    planted = {
        "neffcache.server.lookup": ("from neffcache.server.deps import Backends\n", False),
        "neffcache.server.scrub": (
            "def f():\n    from starlette.responses import Response\n",
            False,
        ),
        "neffcache.server.reports": ("if TYPE_CHECKING:\n    import fastapi\n", True),
        "neffcache.server.api.entries": ("from fastapi import APIRouter\n", False),
        "neffcache.server.services.leases": (
            "from neffcache.server.api.entries import stamped\n",
            False,
        ),
        "neffcache.server.cli": ("def serve():\n    from .app import create_app\n", False),
    }
    assert layer_violations(planted) == {
        "neffcache.server.lookup": ["neffcache.server.deps", "neffcache.server.deps.Backends"],
        "neffcache.server.scrub": ["starlette.responses", "starlette.responses.Response"],
        "neffcache.server.services.leases": [
            "neffcache.server.api.entries",
            "neffcache.server.api.entries.stamped",
        ],
    }


def test_the_http_layer_is_where_the_http_stack_is_imported() -> None:
    # Not vacuous: each listed module exists, and the layer does import FastAPI.
    server = sources_of("server")
    for layer in HTTP_LAYER:
        assert any(within(module, (layer,)) for module in server), layer
    assert any(
        within(name, ("fastapi",))
        for module, (source, is_package) in server.items()
        if within(module, HTTP_LAYER)
        for name in runtime_imports(source, module, is_package=is_package, deferred=False)
    )


# --- (8) no import cycles -------------------------------------------------------------


def import_graph(sources: dict[str, tuple[str, bool]], *, deferred: bool) -> dict[str, set[str]]:
    """Each module's edges to the modules of ``sources`` it imports. An edge to one of
    its own enclosing packages is left out: Python imports those before the module,
    so they can never wait on it."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        names = runtime_imports(source, module, is_package=is_package, deferred=deferred)
        graph[module] = {
            name
            for name in names
            if name in sources and name != module and not module.startswith(name + ".")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, with an
    explicit stack), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def closing_edges(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Module-level imports that close a cycle through any imports, function-level ones
    included: such a cycle still runs one module while the other is half-initialised,
    whenever the function runs during the import (or a later edit moves it up)."""
    eager = import_graph(sources, deferred=False)
    every = import_graph(sources, deferred=True)
    found = []
    for module in sorted(eager):
        for target in sorted(eager[module]):
            seen, todo = {target}, [target]
            while todo:
                for nxt in every[todo.pop()] - seen:
                    seen.add(nxt)
                    todo.append(nxt)
            if module in seen:
                found.append(f"{module} -> {target}")
    return found


def all_sources() -> dict[str, tuple[str, bool]]:
    return {module: found for package in PACKAGES for module, found in sources_of(package).items()}


def test_no_import_cycles() -> None:
    # Module-level imports only (TYPE_CHECKING ones excluded), in all three roots.
    assert cycles(import_graph(all_sources(), deferred=False)) == []


@pytest.mark.parametrize("package", ["keying", "client", "server"])
def test_no_module_level_import_closes_a_cycle(package: str) -> None:
    # Stricter: no cycle even through function-level imports. The client defers many
    # imports on purpose (the hook's import time, the shim's hit), and a deferred one
    # that pointed back would still run a module half-initialised when it ran during
    # an import.
    assert closing_edges(sources_of(package)) == []


def test_no_cycle_even_through_function_level_imports() -> None:
    assert cycles(import_graph(all_sources(), deferred=True)) == []


def test_a_planted_cycle_would_be_caught() -> None:
    planted = {
        "neffcache.server.a": ("from neffcache.server import b\n", False),
        "neffcache.server.b": ("from .c import x\n", False),
        "neffcache.server.c": ("import neffcache.server.a\n", False),
        "neffcache.server.d": ("def f():\n    from . import e\n", False),
        "neffcache.server.e": ("from neffcache.server import d\n", False),
        "neffcache.server.f": ("if TYPE_CHECKING:\n    from . import g\n", False),
        "neffcache.server.g": ("from neffcache.server import f\n", False),
        # A package's modules import it first: never a cycle.
        "neffcache.server": ("def create():\n    from .a import y\n", True),
    }
    eager = import_graph(planted, deferred=False)
    assert cycles(eager) == [["neffcache.server.a", "neffcache.server.b", "neffcache.server.c"]]
    assert closing_edges(planted) == [
        "neffcache.server.a -> neffcache.server.b",
        "neffcache.server.b -> neffcache.server.c",
        "neffcache.server.c -> neffcache.server.a",
        "neffcache.server.e -> neffcache.server.d",
    ]
