"""How the state step stores one shard in Spark's state: the one layout, and its tag.

Per shard key (``streaming.state``): a value state ``shard_text`` with the whole record
(``ShardState.to_bytes``), a map state ``shard_deltas`` of the delta records written since
(number 1, 2, ... -> record), and a value state ``shard_tag`` naming the record and every delta
(``tag``). Records are kept as base64 text (``to_text``: why). This is the only layout read: a
checkpoint whose shards an older version stored otherwise (a binary ``shard`` value and a list
state ``shard_delta``, with tags not of ``tag``'s form) is refused with one line
(``OlderStateLayout``); docs/deploy.md, "Upgrading a checkpoint", says what to do.

Why a map of deltas and not a list: a worker that missed a delta reads that entry alone, where
a list is read whole (the state server copies every value it returns byte by byte, and at a
million bundles the list of a shard is megabytes). Why the tag: it lists the id of every write
since the whole record, so a worker's cached copy (``streaming.shard_cache``) is known to be
the stored state, or a state the store continues, from the tag alone.
"""

from __future__ import annotations

import binascii
import uuid
from typing import Any

from streaming.shard_state import ShardState
from streaming.state_keys import shard_name

SHARD_TEXT_SCHEMA = "blob string"  # the whole record as base64 text
SHARD_DELTAS_KEY_SCHEMA = "k int"  # the delta's number after the whole record, from 1
SHARD_DELTAS_SCHEMA = "blob string"  # the record as base64 text
SHARD_TAG_SCHEMA = "tag string"
_TAG_MARK = "m"  # every tag starts with it (``tag``)


OLDER_LAYOUT_MARK = "is of an older layout"
"""The words of ``OlderStateLayout``'s message that survive the trip through Spark's worker
error: ``lbctl stream`` stops instead of restarting when a failure names them."""


class OlderStateLayout(RuntimeError):
    """A checkpoint whose shard state an older version stored in another layout.

    Why refused rather than read: this version keeps one layout, so a store of another is
    neither read nor rewritten; the operator starts the job on a new checkpoint, whose averages
    fill again from the next reports (docs/deploy.md, "Upgrading a checkpoint")."""

    def __init__(self, key_name: str, tag: str) -> None:
        super().__init__(
            f"the checkpoint's state of shard {shard_name(key_name)} {OLDER_LAYOUT_MARK} "
            f"(tag {tag[:40]!r}); this version reads only its own: start the job on a new "
            'checkpoint folder (docs/deploy.md, "Upgrading a checkpoint")'
        )


class ShardStore:
    """The three state variables of one shard key (Spark's handle keys them implicitly)."""

    def __init__(self, handle: Any) -> None:
        self.text = handle.getValueState("shard_text", SHARD_TEXT_SCHEMA)
        self.tag_state = handle.getValueState("shard_tag", SHARD_TAG_SCHEMA)
        self.deltas = handle.getMapState(
            "shard_deltas", SHARD_DELTAS_KEY_SCHEMA, SHARD_DELTAS_SCHEMA
        )

    def stored_tag(self) -> str | None:
        got = self.tag_state.get()
        return got[0] if got is not None else None

    def read(self, key_name: str, stored_tag: str, record: bytes | None = None) -> ShardState:
        """The stored record with its deltas applied, at ``stored_tag``; ``record``: the whole
        record stored under the tag's id, from elsewhere (``streaming.shard_records``), so
        only the deltas are read from the store."""
        parts = tag_parts(stored_tag)
        if parts is None:
            raise OlderStateLayout(key_name, stored_tag)
        if record is None:
            stored = self.text.get()
            record = from_text(stored[0]) if stored else None
        deltas = sorted((int(k[0]), from_text(v[0])) for k, v in self.deltas.iterator())
        if record is None or [k for k, _ in deltas] != list(range(1, len(parts[1]) + 1)):
            raise RuntimeError(
                f"state of {key_name}: tag {stored_tag} names a record and {len(parts[1])} delta "
                f"records, the store holds {'a' if record is not None else 'no'} record and "
                f"deltas {[k for k, _ in deltas]}"
            )
        state = ShardState.from_bytes(record, [d for _, d in deltas])
        state.tag = stored_tag
        return state

    def delta(self, k: int) -> bytes | None:
        """Delta record number ``k``, or None when the store holds none."""
        got = self.deltas.getValue((k,))
        return None if got is None else from_text(got[0])

    def write_whole(self, state: ShardState, record: bytes) -> None:
        """Store ``record`` (``state.to_bytes()``) as the whole record, the deltas dropped;
        ``state`` is marked as stored under a fresh tag."""
        state.stored, state.deltas, state.delta_rows = True, 0, 0
        state.tag = tag(uuid.uuid4().hex, [])
        self.text.update((to_text(record),))
        self.deltas.clear()
        self.tag_state.update((state.tag,))

    def write_delta(self, state: ShardState, record: bytes, rows: int) -> None:
        """Store ``record`` (``rows`` rows) as the next delta after ``state``'s stored tag."""
        parts = tag_parts(state.tag)
        if parts is None:
            raise RuntimeError(f"a delta after no stored record (tag {state.tag!r})")
        state.deltas += 1
        state.delta_rows += rows
        state.tag = tag(parts[0], [*parts[1], uuid.uuid4().hex[:16]])
        self.deltas.updateValue((state.deltas,), (to_text(record),))
        self.tag_state.update((state.tag,))

    def clear(self) -> None:
        self.text.clear()
        self.deltas.clear()
        self.tag_state.clear()


def to_text(record: bytes) -> str:
    """A record as the state store keeps it: base64 text.

    Why text: the state server hands every value back to Python through a pickler that turns
    binary into a bytearray by building a string one byte at a time and encoding it as UTF-8,
    tens of nanoseconds per byte, and at a million bundles a worker reads back megabytes of
    records per batch; ASCII text crosses as a plain copy, and base64 costs about a
    nanosecond per byte each way (a third more bytes stored)."""
    return binascii.b2a_base64(record, newline=False).decode("ascii")


def from_text(text: str) -> bytes:
    """The record of ``to_text``."""
    return binascii.a2b_base64(text)


def tag(base_id: str, deltas: list[str]) -> str:
    """A shard's stored tag: its whole record's id and the id of every delta record written
    after it, in order (each write adds a fresh id, so a tag names one write and its history,
    even of a batch replayed after the store rolled back)."""
    return f"{_TAG_MARK}:{base_id}:{len(deltas)}:{'.'.join(deltas)}"


def record_id(stored_tag: str) -> str:
    """The id of the whole record a ``tag`` names."""
    parts = tag_parts(stored_tag)
    if parts is None:
        raise ValueError(f"not a shard tag: {stored_tag[:40]!r}")
    return parts[0]


def tag_parts(text: str) -> tuple[str, list[str]] | None:
    """(whole record's id, ids of the deltas after it) of a ``tag``; None for any other string
    (a tag an older layout wrote, or none)."""
    parts = text.split(":")
    if len(parts) != 4 or parts[0] != _TAG_MARK or not parts[2].isdigit():
        return None
    deltas = parts[3].split(".") if parts[3] else []
    return (parts[1], deltas) if len(deltas) == int(parts[2]) else None
