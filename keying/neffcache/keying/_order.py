"""The canonical order of a module's computations, shared by both canonicalization paths."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from ._errors import KeyingError


def canonical_order(entry: int, callees: Mapping[int, Iterable[int]]) -> list[int]:
    """Post-order from the entry through called computations, callees first.

    ``callees`` maps each computation id to the ids its instructions call, in order of
    appearance (negative values are ignored: the bulk path's boundary sentinels).
    Computations nothing reaches follow in their original order: they are part of what
    the producer asked to compile. Iterative, so deep call chains cannot hit Python's
    recursion limit.
    """
    order: list[int] = []
    seen = {entry}
    stack: list[tuple[int, Iterator[int]]] = [(entry, _calls(entry, callees))]
    while stack:
        comp_id, calls = stack[-1]
        for callee in calls:
            if callee not in seen:
                seen.add(callee)
                stack.append((callee, _calls(callee, callees)))
                break
        else:
            stack.pop()
            order.append(comp_id)
    order.extend(comp_id for comp_id in callees if comp_id not in seen)
    return order


def _calls(comp_id: int, callees: Mapping[int, Iterable[int]]) -> Iterator[int]:
    for callee in callees[comp_id]:
        if callee < 0:
            continue
        if callee not in callees:
            raise KeyingError(
                f"not an HLO module: an instruction calls computation id {callee}, "
                "which does not exist"
            )
        yield callee
