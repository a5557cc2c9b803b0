"""``Sequences`` (sequences.py) in Redis: a log ``{log}`` is a sorted set of its items
scored by time, each member "<seq, 20 digits> <at> <JSON [group, head, tag]>\\n<body>",
its sequence in ``{log}-seq``, each tag's newest in a list, each group's places in a
sorted set with their bytes, kept in step by one script per append
(redis_scripts.py). For the log ``events`` these are the keys earlier servers kept
the events in (redis.py), so a log they wrote reads on. Key layout: redis.py.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Sequence

import redis
from redis.typing import EncodableT

from .redis_primitives import PREFIX, as_str, escaped, lifetime_ms
from .redis_scripts import APPEND_SEQUENCE, READ_SEQUENCE
from .sequences import Item, Place, Placed, Trim

# Items per append script: each call holds Redis for its whole batch.
APPEND_BATCH = 500
# Items read per round trip when only some groups are wanted (picked out in Python).
PAGE = 500
# Items kept per (group, tag) for ``newest`` of a tag: explanations read a few.
PER_TAG = 100
# Items dropped per script call at most (a lowered ``keep`` drops many at once): each
# call holds Redis for its whole batch.
TRIM_BATCH = 5000


class RedisSequences:
    """``Sequences`` over one Redis database."""

    def __init__(
        self, client: redis.Redis, mapped: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._redis = client
        self._mapped = mapped
        self._append = client.register_script(APPEND_SEQUENCE)
        self._read_after = client.register_script(READ_SEQUENCE)

    def append(self, log: str, items: Sequence[Item], trim: Trim) -> None:
        # Every call bounds every group of the whole append: a later call may still
        # owe an earlier one's trimming.
        bounded = sorted({i.group for i in items}) if trim.max_bytes is not None else []
        more = True
        for start in range(0, len(items), APPEND_BATCH):
            more = self._append_batch(log, items[start : start + APPEND_BATCH], trim, bounded)
        while more:  # trimming left for later calls: each drops at most TRIM_BATCH
            more = self._append_batch(log, [], trim, bounded)

    def _append_batch(
        self, log: str, items: Sequence[Item], trim: Trim, bounded: Sequence[str]
    ) -> bool:
        """Append (up to APPEND_BATCH) items and trim, the ``bounded`` groups to
        ``trim.max_bytes`` too; True when more trimming is due."""
        keys = [PREFIX + log, f"{PREFIX}{log}-seq", f"{PREFIX}{log}-bytes"]
        slots: dict[tuple[str, str], int] = {}
        records: list[EncodableT] = []
        for item in items:
            slot = 0
            if item.tag:
                where = (item.group, item.tag)
                if where not in slots:
                    keys.append(_tag_key(log, *where))
                    slots[where] = len(keys)  # 1-based in Lua
                slot = slots[where]
            records += [repr(item.at), item_text(item), slot]
        args: list[EncodableT] = [
            trim.keep,
            repr(trim.before),
            PER_TAG,
            _lists_life_ms(items, trim.before),
            f"{PREFIX}{log}:",
            TRIM_BATCH,
            "" if trim.max_bytes is None else trim.max_bytes,
            f"{PREFIX}{log}-ns:",
            len(bounded),
            *bounded,
            *records,
        ]
        with self._mapped():
            return bool(self._append(keys=keys, args=args))

    def read(
        self, log: str, after: Place, until: float, groups: Sequence[str] | None, limit: int
    ) -> list[Placed]:
        at, seq = after
        wanted = None if groups is None else set(groups)
        # With no filter every item read is kept: read no more than asked.
        page = PAGE if wanted is not None else min(limit, PAGE)
        found: list[Placed] = []
        while len(found) < limit:
            args: list[EncodableT] = [repr(at), f"{seq:020d}", f"({until!r}", page]
            with self._mapped():
                rows = self._read_after(keys=[PREFIX + log], args=args)
            members = [as_str(member) for member in rows]
            for member in members:
                placed = _placed(member)
                at, seq = placed.place  # read: the next page starts after it
                if wanted is None or placed.item.group in wanted:
                    found.append(placed)
            if len(members) < page:
                break
        return found[:limit]

    def newest(
        self, log: str, group: str | None, tag: str | None, since: float, limit: int
    ) -> list[Placed]:
        if limit < 1:
            return []
        if group is not None and tag is not None:
            return self._newest_of_tag(log, group, tag, since, limit)
        found: list[Placed] = []
        # With no group every item read is kept: read no more than ``limit``.
        page = PAGE if group is not None else min(limit, PAGE)
        cursor = _NewestCursor()
        while len(found) < limit:
            with self._mapped():
                rows = self._redis.zrevrangebyscore(
                    PREFIX + log, cursor.top, repr(since), cursor.skip, page, withscores=True
                )
            assert isinstance(rows, list), type(rows)
            for pair in rows:
                assert isinstance(pair, tuple), type(pair)  # withscores: (member, score)
                member, score = as_str(pair[0]), float(pair[1])
                if not cursor.advance(member, score):
                    continue  # read already, or appended since the read began
                placed = _placed(member)
                if group is None or placed.item.group == group:
                    found.append(placed)
            if len(rows) < page:
                break
        return found[:limit]

    def _newest_of_tag(
        self, log: str, group: str, tag: str, since: float, limit: int
    ) -> list[Placed]:
        with self._mapped():
            members = self._redis.lrange(_tag_key(log, group, tag), 0, -1)
        assert isinstance(members, list), type(members)
        # Pushed in order of appending, which replicas' clocks may not quite follow.
        found = [p for p in map(_placed, map(as_str, members)) if p.item.at >= since]
        found.sort(key=lambda placed: placed.place, reverse=True)
        return found[:limit]

    def group_bytes(self, log: str, group: str) -> int:
        with self._mapped():
            value = self._redis.hget(f"{PREFIX}{log}-bytes", group)
        return int(as_str(value)) if value is not None else 0


class _NewestCursor:
    """Where a newest-first read of a log is: pages go on from the lowest score read
    so far, skipping as many members of that score as were read (there may be many
    items of one instant), so each page costs O(log n) plus what it skips of one
    instant, never an offset from the newest. An item appended meanwhile at that
    score sorts before them (a higher sequence) and shifts them down: ``advance``
    drops what it has read already, or was appended after the read began, by member
    (members of one score compare by their sequence, which leads them)."""

    def __init__(self) -> None:
        self._score: float | None = None
        self._member = ""  # the last member taken, of that score
        # Rows of that score read so far, taken or dropped: every row moves the next
        # page on, so that appends during a read cannot make it read one page forever.
        self._at_score = 0

    @property
    def top(self) -> str:
        return "+inf" if self._score is None else repr(self._score)

    @property
    def skip(self) -> int:
        return self._at_score

    def advance(self, member: str, score: float) -> bool:
        """Move past ``member``; False when it is not to be taken (see above)."""
        if score == self._score:
            self._at_score += 1
            if member >= self._member:
                return False
        else:
            self._score, self._at_score = score, 1
        self._member = member
        return True


def _tag_key(log: str, group: str, tag: str) -> str:
    # The append script builds the same name from its prefix, escaping as escaped() does.
    return f"{PREFIX}{log}:{escaped(group)}:{tag}"


def _lists_life_ms(items: Sequence[Item], before: float) -> int:
    """How long the tags' lists live: no longer than the batch's newest item is
    retained (0, for ever, for a log not bounded by age)."""
    if math.isinf(before):
        return 0
    return lifetime_ms(max((i.at for i in items), default=before) - before)


def item_text(item: Item) -> str:
    """An item's member in its log, but for the leading sequence the script adds."""
    # JSON has no raw newline: the body starts after the first one.
    header = json.dumps([item.group, item.head, item.tag], ensure_ascii=False)
    return f"{item.at!r} {header}\n{item.body}"


def _placed(member: str) -> Placed:
    """A log's member: its place (time, sequence) and its item."""
    seq, at, rest = member.split(" ", 2)
    header, body = rest.split("\n", 1)
    group, head, tag = json.loads(header)
    return Placed((float(at), int(seq)), Item(float(at), group, tag, head, body))
