"""The probe ``neffcache doctor`` runs in each interpreter it checks, as
``python -c <this file's text> [--hook] [--daemon SHIM]``: in a child, so that an
interpreter that hangs on import (a real libneuronxla loads a 200 MB library) is ended
by a timeout, and so that what is seen is that interpreter's, not the doctor's own.

It prints one line, ``MARK`` then a JSON object: the interpreter (executable, prefix,
version), whether neffcache imports there and whether its ``.pth`` hook line ran, the
versions of the Neuron stacks' distributions, ``neuronxcc.__version__``, and with
``--hook`` what the hook made of libneuronxla: armed, every ``create_compile_cache``
binding replaced, the cache the SDK gets for the configured URL, and the SDK's
``CompileCache`` surface against the methods neffcache's proxy serves. With
``--daemon SHIM`` it prints only the hit daemon's socket as that shim names it.

Written for any Python 3 the tools may run under (nothing newer than 3.8), with the
standard library only at the top: neffcache may not import in that interpreter, and
saying so is the point.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MARK = "neffcache-doctor-probe: "
# The distributions of the stacks docs/client.md's table names, and what they need.
DISTRIBUTIONS = (
    "torch",
    "torch-xla",
    "torch-neuronx",
    "libneuronxla",
    "neuronx-cc",
    "vllm-neuron",
    "libtorch-neuronx-lite",
    "jax",
    "jax-neuronx",
    "optimum-neuron",
    "neuronx-distributed",
    "neuronx-distributed-inference",
    "neuronx-distributed-training",
    "nki",
    "neffcache",
)
PACKAGE = "libneuronxla"
# The modules the hook patches or reads (docs/neuron-sdk.md#provenance lists these three files).
SUBMODULES = ("neuron_cc_cache", "neuron_cc_wrapper", "libncc")
# The fields of setup_args()'s first item that public callers read
# (docs/neuron-sdk.md#cache-location).
SETUP_FIELDS = ("cache_dir", "no_cache", "dump", "compile_workdir")


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def interpreter() -> dict[str, Any]:
    import platform

    facts: dict[str, Any] = {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "python": platform.python_version(),
        # The .pth line puts this finder on sys.meta_path at start-up (site ran it).
        "pth_loaded": any(type(f).__name__ == "NeffcacheArm" for f in sys.meta_path),
        "pth_files": pth_files(),
        "libneuronxla_found": found(PACKAGE),
    }
    try:
        from neffcache.client import config

        facts["neffcache"] = os.path.dirname(os.path.dirname(os.path.abspath(config.__file__)))
    except Exception as exc:
        facts["neffcache_error"] = one_line(exc)
    facts["dists"] = distributions()
    facts.update(neuronxcc())
    return facts


def pth_files() -> list[str]:
    try:
        import site

        dirs = [*site.getsitepackages(), site.getusersitepackages()]
    except Exception:  # some virtualenvs' site lacks these
        dirs = [p for p in sys.path if p.endswith("-packages")]
    return [p for p in (os.path.join(d, "neffcache_hook.pth") for d in dirs) if os.path.isfile(p)]


def found(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def distributions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except Exception:
            versions[name] = None
    return versions


def neuronxcc() -> dict[str, Any]:
    """``neuronxcc.__version__``: what libneuronxla names its entries after
    (docs/neuron-sdk.md#compiler-version-of-an-entry)."""
    if not found("neuronxcc"):
        return {"neuronxcc": None}
    try:
        import importlib

        module = importlib.import_module("neuronxcc")
        version = getattr(module, "__version__", None)
        return {"neuronxcc": str(version) if version else None}
    except Exception as exc:
        return {"neuronxcc": None, "neuronxcc_error": one_line(exc)}


def hook() -> dict[str, Any]:
    """What the hook made of libneuronxla in this process (nothing compiles)."""
    import importlib

    facts: dict[str, Any] = {}
    try:
        package = importlib.import_module(PACKAGE)
    except Exception as exc:
        return {"import_error": one_line(exc)}
    facts["version"] = str(getattr(package, "__version__", "") or "") or None
    for name in SUBMODULES:
        try:
            importlib.import_module(f"{PACKAGE}.{name}")
        except Exception as exc:
            facts.setdefault("missing_modules", {})[name] = one_line(exc)
    # Read before neffcache is imported here: only the .pth line may have armed it.
    armed = sys.modules.get("neffcache.client.hook")
    facts["armed"] = armed is not None and getattr(armed, "_FINDER", None) in sys.meta_path
    facts["bindings"] = bindings()
    facts.update(surface())
    facts["setup_args"] = setup_args()
    facts["cache"] = served_cache()
    return facts


def bindings() -> dict[str, bool]:
    """Every loaded libneuronxla module binding ``create_compile_cache``: replaced?"""
    seen: dict[str, bool] = {}
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        value = getattr(module, "create_compile_cache", None)
        if value is not None:
            seen[name] = bool(getattr(value, "__neffcache_patched__", False))
    return seen


def surface() -> dict[str, Any]:
    """The SDK's CompileCache classes against the proxy neffcache builds on them."""
    module = sys.modules.get(f"{PACKAGE}.neuron_cc_cache")
    base = getattr(module, "CompileCache", None)
    if not isinstance(base, type):
        return {"surface_error": f"{PACKAGE}.neuron_cc_cache has no CompileCache class"}
    own = public_members(base)
    classes = {
        name: sorted(set(public_members(value)) - set(own))
        for name, value in sorted(vars(module).items())
        if isinstance(value, type) and issubclass(value, base) and value is not base
    }
    facts: dict[str, Any] = {"base": own, "subclasses": classes}
    try:
        from neffcache.client.proxy import make_proxy_class

        proxy = make_proxy_class(base)
    except Exception as exc:
        facts["proxy_error"] = one_line(exc)
        return facts
    served = sorted(n for n in vars(proxy) if not n.startswith("_"))
    facts["served"] = served
    # A method of the base the proxy neither overrides nor delegates runs the SDK's own
    # code on the proxy (whose paths point into L1): it never asks the server, and the
    # SDK's code may rely on state the proxy does not have.
    facts["unserved"] = sorted(n for n, kind in own.items() if kind == "method" and n not in served)
    facts["inherited"] = sorted(
        n for n, kind in own.items() if kind != "method" and n not in served
    )
    sdk = set(own).union(*classes.values())
    facts["absent"] = sorted(n for n in served if n not in sdk)
    return facts


def public_members(cls: type) -> dict[str, str]:
    """Public attributes ``cls`` defines or inherits from a base other than object,
    with their kind: method, staticmethod, classmethod, property, attribute."""
    members: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod, property)):
                members[name] = type(value).__name__
            else:
                members[name] = "method" if callable(value) else "attribute"
    return members


def setup_args() -> str:
    """``libncc.setup_args()``'s return type as written: ``tuple(NeuronCCArgs, list,
    str)``, and the fields public callers read that its first item lacks."""
    try:
        libncc = sys.modules.get(f"{PACKAGE}.libncc")
        if libncc is None or not hasattr(libncc, "setup_args"):
            return f"no {PACKAGE}.libncc.setup_args"
        value = libncc.setup_args()
    except BaseException as exc:  # argparse may exit on flags it does not take
        return f"setup_args() raised {one_line(exc)}"
    if isinstance(value, tuple):
        text = "tuple(" + ", ".join(type(v).__name__ for v in value) + ")"
        first = value[0] if value else None
    else:
        text, first = type(value).__name__, value
    lacking = [f for f in SETUP_FIELDS if not hasattr(first, f)]
    return text + (f"; its first item lacks {', '.join(lacking)}" if lacking else "")


def served_cache() -> dict[str, Any]:
    """The cache the SDK gets when it resolves its URL itself (``get_cache_url()``, as
    torch-xla does), when the environment names a neffcache URL; nothing compiles."""
    try:
        from neffcache.client.config import wants_neffcache
    except Exception as exc:
        return {"error": one_line(exc)}
    if not wants_neffcache(os.environ):
        return {"skipped": "no neffcache URL in the environment"}
    module = sys.modules.get(f"{PACKAGE}.neuron_cc_cache")
    try:
        url = module.CacheUrl.get_cache_url()  # type: ignore[union-attr]
        cache = module.create_compile_cache(url)  # type: ignore[union-attr]
    except Exception as exc:
        return {"error": one_line(exc)}
    return {
        "type": type(cache).__name__,
        "module": type(cache).__module__,
        "sdk_url": str(getattr(url, "url", url)),
        "cache_path": str(getattr(cache, "cache_path", "")),
    }


def daemon(shim: str) -> dict[str, Any]:
    """The hit daemon's directory and socket as the shim ``shim`` names them when this
    Python runs it (``shimclient.socket_path``). The name hashes ``sys.path``, and a
    script's first entry is its directory where ``-c`` puts ``''`` (neither has one
    under ``-I`` or ``PYTHONSAFEPATH``)."""
    if sys.path and sys.path[0] == "":
        sys.path[0] = os.path.dirname(os.path.realpath(shim))
    search = list(sys.path)
    try:
        from neffcache.client import shimclient
    except Exception as exc:
        return {"neffcache_error": one_line(exc)}
    sys.path[:] = search  # as the shim has it, whatever the import did
    directory, socket = shimclient.socket_path(os.environ, os.getuid())
    return {"directory": directory, "socket": socket}


def main(argv: list[str]) -> None:
    # --daemon: that alone, for the rest costs a second or two.
    facts = daemon(argv[argv.index("--daemon") + 1]) if "--daemon" in argv else interpreter()
    if "--hook" in argv and facts.get("libneuronxla_found"):
        facts["hook"] = hook()
    sys.stdout.write(MARK + json.dumps(facts) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
