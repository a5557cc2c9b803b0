"""How many threads BLAKE3 gets: one below PARALLEL_HASH_FROM or on a single usable
CPU (the shim's one-shot process pays more for the pool than it saves), its pool
above it, and the same digest either way."""

from __future__ import annotations

import os

import blake3
import pytest

from neffcache.keying import PARALLEL_HASH_FROM, CompileContext, direct_key, hash_threads


def test_a_graph_sized_input_hashes_on_one_thread() -> None:
    assert hash_threads(0) == 1
    assert hash_threads(512 << 10) == 1
    assert hash_threads(PARALLEL_HASH_FROM - 1) == 1


def test_a_large_input_uses_the_pool_when_more_than_one_cpu_is_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert hash_threads(PARALLEL_HASH_FROM) == blake3.blake3.AUTO


def test_a_process_pinned_to_one_cpu_never_starts_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1}, raising=False)
    assert hash_threads(PARALLEL_HASH_FROM * 4) == 1


def test_without_affinity_the_cpu_count_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert hash_threads(PARALLEL_HASH_FROM) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert hash_threads(PARALLEL_HASH_FROM) == blake3.blake3.AUTO


def test_the_direct_key_does_not_depend_on_the_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = bytes(range(256)) * ((PARALLEL_HASH_FROM + 4096) // 256)
    context = CompileContext(
        compiler_version="2.21.18209.0+043b1bf7", flags=["--target=trn1"], target="trn1"
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    pooled = direct_key(data, context)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert direct_key(data, context) == pooled
