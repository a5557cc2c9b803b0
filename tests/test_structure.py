"""Package structure (STYLE.md section 7, rule 8): one PEP 420 namespace over three
source roots, imports that only point the allowed way, and complete public APIs."""

from __future__ import annotations

import ast
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
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
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


def test_keying_imports_only_stdlib_blake3_protobuf_and_itself() -> None:
    allowed = ("neffcache.keying", *KEYING_THIRD_PARTY)
    bad = {
        module: sorted(name for name in names if not (is_stdlib(name) or within(name, allowed)))
        for module, names in imports_of("keying").items()
    }
    assert {module: names for module, names in bad.items() if names} == {}


def test_client_imports_no_server_stack() -> None:
    bad = {
        module: sorted(name for name in names if within(name, CLIENT_FORBIDDEN))
        for module, names in imports_of("client").items()
    }
    assert {module: names for module, names in bad.items() if names} == {}


def test_client_imports_only_stdlib_keying_blake3_and_itself() -> None:
    # The .pth hook runs in every Python process of a training image: nothing it can
    # reach may add a dependency beyond what the base install brings.
    allowed = ("neffcache.client", "neffcache.keying", "blake3")
    bad = {
        module: sorted(name for name in names if not (is_stdlib(name) or within(name, allowed)))
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
