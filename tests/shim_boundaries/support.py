"""Helpers for the shim boundary tests: hosts that run the shim, and the compiler run alone.

A *host* is its own L1, working directory and run manifest; hosts share the server.
``reference`` runs the same command line with no shim anywhere, in a working directory
laid out the same way: what the caller would get from the compiler itself. A test
on false hits primes the cache on one host, runs the probe on another and compares the
probe's outcome (exit code, the files it wrote) with the reference's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.e2e import (
    COMPILER,
    Done,
    Sandbox,
    Server,
    clean_environ,
    hlo,
    read_run_manifest,
    search_path,
)

HERE = Path(__file__).resolve().parent
ARGPARSE_CC = HERE / "argparse_cc.py"

# Lays out a working directory (the input files a command names).
Layout = Callable[[Path], None]


def put_hlo(name: str, as_name: str = "in.pb") -> Layout:
    """A layout holding fixture ``name`` (tests/fixtures/hlo) as ``as_name``."""

    def lay(cwd: Path) -> None:
        target = cwd / as_name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(hlo(name), target)

    return lay


def executable(directory: Path, source: Path, name: str = "neuronx-cc") -> Path:
    """``source`` (a Python script) as an executable ``directory/name`` run by this
    interpreter."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    target.write_text(f"#!{sys.executable}\n" + source.read_text())
    target.chmod(0o755)
    return target


def argparse_compiler(sandbox: Sandbox) -> Path:
    """tests/shim_boundaries/argparse_cc.py as an executable ``neuronx-cc``."""
    return executable(sandbox.new_dir("argparse-cc"), ARGPARSE_CC)


@dataclass
class Host:
    sandbox: Sandbox
    name: str
    url: str
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.l1 = self.sandbox.new_dir(f"{self.name}-l1")
        self.manifest = self.sandbox.root / f"{self.name}-run-manifest.jsonl"

    def env(self, **extra: str | None) -> dict[str, str]:
        return self.sandbox.env(
            l1=self.l1,
            url=self.url,
            url_var="NEFFCACHE_URL",
            shim=True,
            extra={"NEFFCACHE_RUN_MANIFEST": str(self.manifest), **self.extra, **extra},
        )

    def cwd(self, layout: Layout | None = None) -> Path:
        cwd = self.sandbox.new_dir(f"{self.name}-cwd")
        if layout is not None:
            layout(cwd)
        return cwd

    def shim(
        self,
        argv: Sequence[str],
        cwd: Path,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 90,
    ) -> Done:
        return self.sandbox.run(["neuronx-cc", *argv], env or self.env(), cwd=cwd, timeout=timeout)

    def records(self) -> list[dict[str, Any]]:
        return read_run_manifest(self.manifest) if self.manifest.exists() else []

    def last(self) -> dict[str, Any] | None:
        records = self.records()
        return records[-1] if records else None


def hosts(server: Server, sandbox: Sandbox, count: int, **extra: str) -> list[Host]:
    url = server.cache_url(sandbox.namespace)
    return [Host(sandbox, f"host{i}", url, dict(extra)) for i in range(1, count + 1)]


def reference(
    sandbox: Sandbox,
    argv: Sequence[str],
    cwd: Path,
    *,
    compiler: Path = COMPILER,
    extra: Mapping[str, str] | None = None,
) -> Done:
    """``argv`` run by the compiler alone (no shim, no neffcache variable)."""
    env = clean_environ()
    env["PATH"] = search_path()
    env["NEFFCACHE_STANDIN_COUNTER"] = str(sandbox.root / "reference-invocations.log")
    env.update(extra or {})
    return sandbox.run([sys.executable, str(compiler), *argv], env, cwd=cwd)


def files(cwd: Path) -> dict[str, bytes]:
    """Every file under ``cwd`` by relative path (the outcome of a command there)."""
    return {
        str(p.relative_to(cwd)): p.read_bytes()
        for p in sorted(cwd.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def outcome(done: Done, cwd: Path, names: Sequence[str]) -> dict[str, Any]:
    """What a caller sees: the exit code and the named files (None: absent)."""
    return {
        "exit": done.returncode,
        **{n: ((cwd / n).read_bytes() if (cwd / n).is_file() else None) for n in names},
    }


def describe(label: str, host: Host | None = None, done: Done | None = None) -> str:
    parts = [label]
    if host is not None:
        parts.append(f"{host.name} last record: {json.dumps(host.last())[:600]}")
    if done is not None:
        parts.append(done.describe()[-2500:])
    return "\n".join(parts)


def same_outcome(
    probe: tuple[Done, Path], ref: tuple[Done, Path], names: Sequence[str]
) -> tuple[bool, str]:
    got = outcome(probe[0], probe[1], names)
    want = outcome(ref[0], ref[1], names)

    def short(o: dict[str, Any]) -> dict[str, Any]:
        return {k: (v if not isinstance(v, bytes) else v[:24]) for k, v in o.items()}

    return got == want, f"shim: {short(got)}\ncompiler alone: {short(want)}"


def env_without(env: Mapping[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


__all__ = [
    "ARGPARSE_CC",
    "COMPILER",
    "Host",
    "argparse_compiler",
    "describe",
    "env_without",
    "executable",
    "files",
    "hosts",
    "os",
    "outcome",
    "put_hlo",
    "reference",
    "same_outcome",
]
