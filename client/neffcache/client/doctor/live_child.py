"""The child process of ``neffcache doctor --live``: one tiny compile with one stack,
``python -m neffcache.client.doctor.live_child STACK SEED CALLS``, in the environment
and working directory ``live_run`` made for it.

Before the stack runs, the cache class that the hook hands libneuronxla is made to
record each call the SDK makes on it into the file ``CALLS``: one JSON line per call
(its method, the base name of its path argument, a boolean answer, the process and a
monotonic time), appended with one ``write`` so that pool workers may share the file.
That is the order in which the SDK asks its cache, which no public source gives
(docs/neuron-sdk.md#hit-detection). Nothing else changes (neffcache's proxy module is
only imported earlier than the hook would): the hook arms itself, when libneuronxla is
imported, from its ``.pth`` line as in a job.

The compile itself is ``live_drivers.drive``: the real stacks. The test suite sets
``NEFFCACHE_DOCTOR_LIVE_DRIVERS`` to a Python file of its own with the same
``drive(stack, seed, work)``, in which the stand-ins play the stacks; it is meant for
testing the doctor itself, and the doctor names it in its output when set.

It prints one line, ``MARK`` then a JSON object: ``status`` (``ok``, ``unavailable``
or ``error``), ``facts`` (the driver's), ``error`` (one line), ``libneuronxla_loaded``
and ``hook_armed``; and exits 0, 3 (unavailable) or 1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any

MARK = "neffcache-doctor-live: "
DRIVERS_ENV = "NEFFCACHE_DOCTOR_LIVE_DRIVERS"
EXIT_UNAVAILABLE = 3
# The proxy's attributes that are not the SDK's calls.
_OWN = ("_stock", "_core")


def record_cache_calls(path: str) -> None:
    """Make every cache class the hook builds from now on record its calls."""
    from neffcache.client import proxy

    make = proxy.make_proxy_class
    if getattr(make, "__neffcache_recording__", False):
        return

    def recording(base: type) -> type:
        cls = make(base)
        for name, value in list(vars(cls).items()):
            if callable(value) and (not name.startswith("_") or name == "__init__"):
                setattr(cls, name, _recorded(path, name, value))
        getter = vars(cls).get("__getattr__")
        if getter is not None:
            cls.__getattr__ = _recorded_getattr(path, getter)  # type: ignore[attr-defined]
        return cls

    recording.__neffcache_recording__ = True  # type: ignore[attr-defined]
    # The hook looks make_proxy_class up when libneuronxla first asks for a cache.
    proxy.make_proxy_class = recording


def _recorded(path: str, name: str, method: Any) -> Any:
    call = "create_compile_cache" if name == "__init__" else name

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.monotonic_ns()
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            _note(path, began, call, args, raised=type(exc).__name__)
            raise
        _note(path, began, call, () if call == "create_compile_cache" else args, result=result)
        return result

    wrapper.__name__ = getattr(method, "__name__", name)
    return wrapper


def _recorded_getattr(path: str, getter: Any) -> Any:
    """Methods the proxy leaves to the SDK's own cache (``__getattr__``), recorded too."""

    def __getattr__(self: Any, name: str) -> Any:  # noqa: N807
        value = getter(self, name)
        if name in _OWN or name.startswith("__") or not callable(value):
            return value

        def delegated(*args: Any, **kwargs: Any) -> Any:
            began = time.monotonic_ns()
            result = value(*args, **kwargs)
            _note(path, began, name, args, result=result)
            return result

        return delegated

    return __getattr__


def _note(path: str, began: int, call: str, args: tuple[Any, ...], **outcome: Any) -> None:
    record: dict[str, Any] = {"t": began, "pid": os.getpid(), "call": call}
    if args and isinstance(args[0], (str, os.PathLike)):
        record["arg"] = os.path.basename(os.fspath(args[0]).rstrip("/"))[:80]
    result = outcome.get("result")
    if isinstance(result, bool):
        record["result"] = result
    if "raised" in outcome:
        record["raised"] = outcome["raised"]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a record lost is a gap in the list, never the SDK's trouble


def drive(stack: str, seed: int, work: str) -> dict[str, Any]:
    """The driver ``NEFFCACHE_DOCTOR_LIVE_DRIVERS`` names, else the real stacks'."""
    override = os.environ.get(DRIVERS_ENV)
    if not override:
        from neffcache.client.doctor import live_drivers

        return live_drivers.drive(stack, seed, work)
    spec = importlib.util.spec_from_file_location("neffcache_doctor_live_drivers", override)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{DRIVERS_ENV}={override} is no Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    facts: dict[str, Any] = module.drive(stack, seed, work)
    return facts


def _hook_armed() -> bool:
    hook = sys.modules.get("neffcache.client.hook")
    return hook is not None and getattr(hook, "_FINDER", None) in sys.meta_path


def main(argv: list[str]) -> int:
    stack, seed, calls = argv[0], int(argv[1]), argv[2]
    from neffcache.client.doctor.live_drivers import Unavailable

    reply: dict[str, Any] = {"status": "ok", "facts": {}}
    try:
        record_cache_calls(calls)
        reply["facts"] = drive(stack, seed, os.getcwd())
    except Unavailable as exc:
        reply.update(status="unavailable", error=str(exc))
    except BaseException as exc:  # the compile's failure is the answer, not a crash
        text = " ".join(str(exc).split())[:500]
        reply.update(status="error", error=f"{type(exc).__name__}: {text}")
        import traceback

        traceback.print_exc()
    reply["libneuronxla_loaded"] = "libneuronxla" in sys.modules
    reply["hook_armed"] = _hook_armed()
    sys.stdout.write(MARK + json.dumps(reply, default=str) + "\n")
    sys.stdout.flush()
    return {"ok": 0, "unavailable": EXIT_UNAVAILABLE}.get(reply["status"], 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
