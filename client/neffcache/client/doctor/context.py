"""The facts the checks share, each gathered once and only when a check asks.

Several checks read the same fact (the server's status serves the token, namespace
and clock checks; the interpreters' probes serve the path, stack and hook checks), and
gathering some costs a child process or a request: each is memoized here. A fact that
cannot be gathered is a value saying why, never an exception.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple, TypeVar, cast

from neffcache.client.api import Api
from neffcache.client.compiler import find_real_compiler, is_shim
from neffcache.client.config import (
    DEFAULT_LOCAL_DIR,
    ClientConfig,
    ConfigError,
    _flag,
    cache_url,
)
from neffcache.client.doctor import interpreters, serverfacts

T = TypeVar("T")
# The programs that run libneuronxla (so the hook must arm in their Python) or the
# compiler, by the names the SDK installs them under
# (docs/neuron-sdk.md#neuron_parallel_compile and #libneuronxla-cache-api).
COMPILER = "neuronx-cc"
SDK_TOOLS = ("torchrun", "neuron_parallel_compile", "neuron_cc_wrapper")
# neuronx-cc --version: about a second for the real one; a hung one must not hang us.
VERSION_TIMEOUT = 30.0
# The live checks' overall deadline (--live-deadline): a tiny compile per stack, twice,
# is meant to take a few minutes on a trn host.
LIVE_SECONDS = 600.0


class Config(NamedTuple):
    """The client configuration as a job would read it. ``config`` is read as if
    ``NEFFCACHE_DISABLE`` were unset, so the server can be checked all the same."""

    config: ClientConfig | None
    error: str | None
    source: str | None  # where the URL in force came from
    url: str | None  # the URL in force, whatever it is
    disabled: bool


class Tool(NamedTuple):
    name: str
    path: str
    command: tuple[str, ...] | None  # its Python (None: not a Python script)


class Context:
    def __init__(
        self,
        environ: Mapping[str, str],
        *,
        read_only: bool = False,
        live_seconds: float = LIVE_SECONDS,
    ) -> None:
        self.environ = dict(environ)
        self.read_only = read_only
        self.live_seconds = live_seconds
        self._memo: dict[Hashable, Any] = {}

    def once(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, called the first time ``key`` is asked for."""
        if key not in self._memo:
            self._memo[key] = make()
        return cast(T, self._memo[key])

    # -- configuration ----------------------------------------------------------------

    def config(self) -> Config:
        return self.once("config", self._config)

    def _config(self) -> Config:
        env = self.environ
        enabled = {k: v for k, v in env.items() if k != "NEFFCACHE_DISABLE"}
        url, source, disabled = cache_url(env), url_source(env), _flag(env, "NEFFCACHE_DISABLE")
        try:
            return Config(ClientConfig.from_env(enabled), None, source, url, disabled)
        except ConfigError as exc:
            return Config(None, str(exc), source, url, disabled)

    def local_dir(self) -> str:
        config = self.config().config
        if config is not None:
            return config.local_dir
        return self.environ.get("NEFFCACHE_LOCAL_DIR") or DEFAULT_LOCAL_DIR

    # -- the server -------------------------------------------------------------------

    def server_status(self) -> serverfacts.ServerStatus | None:
        config = self.config().config
        if config is None:
            return None
        return self.once("status", lambda: serverfacts.status(config, self._api()))

    def round_trip(self) -> serverfacts.RoundTrip | None:
        config = self.config().config
        status = self.server_status()
        if config is None or status is None or status.state == "down":
            return None
        may_write: bool | None = False if self.read_only else None
        caller = status.body.get("caller") if status.state == "ok" else None
        if may_write is None and isinstance(caller, dict):
            may_write = caller.get("scope") in ("write", "admin")
        return self.once(
            "round trip", lambda: serverfacts.round_trip(config, self._api(), may_write)
        )

    def _api(self) -> Api:
        config = self.config().config
        assert config is not None
        return self.once("api", lambda: serverfacts.open_api(config))

    def close(self) -> None:
        api = self._memo.get("api")
        if api is not None:
            api.close()

    # -- PATH and interpreters --------------------------------------------------------

    def compilers_on_path(self) -> list[str]:
        return self.once(
            "compilers", lambda: interpreters.which(COMPILER, self.environ.get("PATH"))
        )

    def shims_on_path(self) -> list[str]:
        return [p for p in self.compilers_on_path() if is_shim(p)]

    def real_compiler(self) -> str | None:
        """The compiler the shim runs (as the wrapper finds it), else the first
        ``neuronx-cc`` on PATH when there is no shim."""
        configured = self.environ.get("NEFFCACHE_REAL_COMPILER") or None
        return find_real_compiler(COMPILER, configured, self.environ.get("PATH"))

    def compiler_version(self) -> tuple[str | None, str | None]:
        """(the real compiler's full version, or None and why)."""
        return self.once("version", self._compiler_version)

    def _compiler_version(self) -> tuple[str | None, str | None]:
        from neffcache.keying import KeyingError, ask_compiler_version

        real = self.real_compiler()
        if real is None:
            return None, "no real neuronx-cc found"
        # The wrapper's own guard: should it be a wrapper of ours after all, it runs the
        # compiler behind it instead of looking itself up again (compiler.py).
        env = {**self.environ, "NEFFCACHE_IN_WRAPPER": "1"}
        try:
            return ask_compiler_version(real, env=env, timeout=VERSION_TIMEOUT), None
        except KeyingError as exc:
            return None, str(exc)

    def tools(self) -> list[Tool]:
        """The real compiler, the shim and the SDK's tools found on PATH."""
        return self.once("tools", self._tools)

    def _tools(self) -> list[Tool]:
        found: list[Tool] = []
        shims = self.shims_on_path()
        if shims:
            found.append(Tool("the shim", shims[0], interpreters.interpreter_of(shims[0])))
        real = self.real_compiler()
        if real is not None and os.path.isfile(real):
            found.append(Tool(COMPILER, real, interpreters.interpreter_of(real)))
        for name in SDK_TOOLS:
            paths = interpreters.which(name, self.environ.get("PATH"))
            if paths:
                found.append(Tool(name, paths[0], interpreters.interpreter_of(paths[0])))
        return found

    def own_command(self) -> tuple[str, ...]:
        return (sys.executable,)

    def probe(self, command: tuple[str, ...], *, hook: bool = False) -> dict[str, Any]:
        """``probe_script``'s facts from the Python ``command`` runs."""
        return self.once(
            ("probe", command, hook),
            lambda: interpreters.probe(command, self.environ, hook=hook),
        )

    def training_pythons(self) -> list[tuple[str, dict[str, Any]]]:
        """(who runs it, facts with the hook's part) of each Python libneuronxla may
        run in: this one (``neffcache doctor``'s, usually the training one) and those
        of torchrun, neuron_parallel_compile and neuron_cc_wrapper; one per
        environment (``sys.prefix``)."""
        return self.once("training", self._training)

    def _training(self) -> list[tuple[str, dict[str, Any]]]:
        commands: dict[tuple[str, ...], list[str]] = {self.own_command(): ["neffcache doctor"]}
        for tool in self.tools():
            if tool.name in SDK_TOOLS and tool.command is not None:
                commands.setdefault(tool.command, []).append(tool.name)
        by_prefix: dict[str, tuple[list[str], dict[str, Any]]] = {}
        for command, names in commands.items():
            facts = self.probe(command, hook=True)
            prefix = str(facts.get("prefix") or " ".join(command))
            if prefix in by_prefix:
                by_prefix[prefix][0].extend(names)
            else:
                by_prefix[prefix] = (list(names), facts)
        return [(", ".join(names), facts) for names, facts in by_prefix.values()]

    def dists(self) -> dict[str, str | None]:
        """The stacks' distributions as the training Pythons have them (the first
        Python that has one wins)."""
        merged: dict[str, str | None] = {}
        for _, facts in self.training_pythons():
            for name, version in (facts.get("dists") or {}).items():
                if merged.get(name) is None:
                    merged[name] = version
        return merged


def url_source(env: Mapping[str, str]) -> str | None:
    """Which setting the URL in force comes from, by config.py's precedence (asked of
    ``cache_url`` itself, one setting at a time, so the two cannot disagree)."""
    if env.get("NEFFCACHE_URL"):
        return "NEFFCACHE_URL"
    if cache_url({"NEURON_CC_FLAGS": env.get("NEURON_CC_FLAGS", "")}):
        return "--cache_dir in NEURON_CC_FLAGS"
    if env.get("NEURON_COMPILE_CACHE_URL"):
        return "NEURON_COMPILE_CACHE_URL"
    return None
