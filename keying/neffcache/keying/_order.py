"""The canonical order of a module's computations, shared by both canonicalization paths."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import chain

from ._errors import KeyingError


def canonical_order(entry: int, callees: Mapping[int, Sequence[int]]) -> list[int]:
    """Post-order from the entry through called computations, callees first.

    ``callees`` maps every computation id, in file order, to the ids its instructions
    call, in order of appearance. Computations nothing reaches follow in file order:
    they are part of what the producer asked to compile. Iterative, so deep call
    chains cannot hit Python's recursion limit.
    """
    missing = set(chain.from_iterable(callees.values())).difference(callees)
    if missing:
        raise KeyingError(
            f"not an HLO module: an instruction calls computation id {min(missing)}, "
            "which does not exist"
        )
    order: list[int] = []
    seen = {entry}
    stack: list[tuple[int, Iterator[int]]] = [(entry, iter(callees[entry]))]
    while stack:
        comp_id, calls = stack[-1]
        for callee in calls:
            if callee in seen:
                continue
            seen.add(callee)
            if callees[callee]:
                stack.append((callee, iter(callees[callee])))
                break
            order.append(callee)  # a leaf, the common case: no frame needed
        else:
            stack.pop()
            order.append(comp_id)
    order.extend(comp_id for comp_id in callees if comp_id not in seen)
    return order
