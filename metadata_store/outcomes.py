"""The decision outcome log: ``P:outcomes`` (first outcome per decision id, for
de-duplication) and ``P:outcome-stream`` (every outcome, for tailing); formats in
``metadata_store.keys``.

Why one repository for both: the controller records an outcome in the hash and the stream in
one script, so two controllers racing on one decision cannot both win the hash, and the
loser's view still shows in the stream as a ``conflict`` naming the outcome that won. The hash
names the change that was made: an ``applied`` replaces a racing ``already_satisfied``.

``OutcomeRecords`` is what the applier (``controller.apply``) asks of a log; ``OutcomeLog``
keeps it in Redis, ``MemoryOutcomeLog`` in process memory with the same rules, so the fast
simulator and the unit tests apply decisions with the controller's own code.
"""

from __future__ import annotations

import collections
import copy
import json
import threading
from typing import Any, Protocol

from loadbalance.decisions import Decision
from metadata_store.keys import Keys

__all__ = ["OUTCOME_STREAM_MAXLEN", "MemoryOutcomeLog", "OutcomeLog", "OutcomeRecords"]

OUTCOME_STREAM_MAXLEN = 100_000

# KEYS: outcomes hash, outcome stream; ARGV: id, doc (JSON), stream maxlen, then the stream
# entry's field/value pairs. The first real outcome of an id wins the hash (a dry run does not
# count, nor does a conflict: it changed nothing, and with two controllers racing it is the
# loser's view of a change the other one is still recording); a later one for the same id comes
# from a second controller that raced this one, and goes to the stream only, as a conflict
# naming the outcome that won. One exception: ``applied`` replaces ``already_satisfied``. With
# two controllers, B can find the change A has just made and record ``already_satisfied``
# while A is between its script and its record; the hash must name the change A made, so A's
# ``applied`` takes the hash and its stream entry names the outcome it replaced (``race``).
_LUA_RECORD = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local first = ''
local replaced = ''
if cur then
  local prev = cjson.decode(cur)['outcome']
  if prev ~= 'dry_run' and prev ~= 'conflict' then first = prev end
end
local entry = {}
for i = 4, #ARGV do entry[#entry + 1] = ARGV[i] end
if first == 'already_satisfied' and entry[4] == 'applied' then
  replaced = first
  first = ''
end
if first == '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  if replaced ~= '' then
    entry[#entry + 1] = 'race'
    entry[#entry + 1] = replaced
  end
else
  entry[4] = 'conflict'
  entry[#entry + 1] = 'race'
  entry[#entry + 1] = first
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
return first
"""


def _stream_entry(d: Decision, outcome: str, reason: str, now_ms: int) -> list[str]:
    """``reason`` is the outcome's; ``decisionReason`` and the brokers say why the policy asked
    (``lbctl monitor`` shows both). ``outcome`` stays the fourth item: the record script sets it."""
    return ["id", d.id, "outcome", outcome, "reason", reason, "kind", d.kind,
            "bundle", d.bundle, "atMs", str(now_ms), "decisionReason", d.reason,
            "source", d.source_broker or "", "destination", d.destination_broker or ""]  # fmt: skip


class OutcomeRecords(Protocol):
    """The outcome log as the applier uses it: read the first outcome, record one, stream one.

    ``record`` is one atomic step: the first real outcome of an id (not ``dry_run``, not
    ``conflict``) wins the hash; a later one goes to the stream only, as a ``conflict`` naming
    the winner, and the winner's outcome is returned ('' when this one won). ``applied``
    replaces ``already_satisfied`` (a racing controller's sighting of this very change), and
    its stream entry names what it replaced (``race``).
    """

    def get(self, decision_id: str) -> dict[str, Any] | None: ...

    def record(self, d: Decision, outcome: str, reason: str, now_ms: int) -> str: ...

    def stream_only(self, d: Decision, outcome: str, reason: str, now_ms: int) -> None: ...


class OutcomeLog:
    """How each decision ended, by decision id, and the stream of every outcome."""

    def __init__(self, client: Any, prefix: str = "lb") -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._record = client.register_script(_LUA_RECORD)

    def get(self, decision_id: str) -> dict[str, Any] | None:
        """The first recorded outcome document of ``decision_id`` (``outcome``, ``reason``, ...)."""
        raw = self._r.hget(self._keys.outcomes(), decision_id)
        return None if raw is None else json.loads(raw)

    def record(self, d: Decision, outcome: str, reason: str, now_ms: int) -> str:
        """Record an outcome in the hash and the stream atomically; the outcome a racing
        controller recorded first for this id ('' when this one is the first)."""
        doc = {"outcome": outcome, "reason": reason, "kind": d.kind,
               "bundle": d.bundle, "atMs": now_ms}  # fmt: skip
        first = self._record(
            keys=[self._keys.outcomes(), self._keys.outcome_stream()],
            args=[d.id, json.dumps(doc), OUTCOME_STREAM_MAXLEN,
                  *_stream_entry(d, outcome, reason, now_ms)],
        )  # fmt: skip
        if not first:
            return ""
        return first.decode() if isinstance(first, bytes) else str(first)

    def stream_only(self, d: Decision, outcome: str, reason: str, now_ms: int) -> None:
        """Stream (never hash) an outcome: a duplicate, so replays show in the tail."""
        fields = _stream_entry(d, outcome, reason, now_ms)
        self._r.xadd(
            self._keys.outcome_stream(),
            dict(zip(fields[::2], fields[1::2], strict=True)),
            maxlen=OUTCOME_STREAM_MAXLEN,
            approximate=True,
        )

    def record_unreadable(self, where: str, outcome: str, reason: str, now_ms: int) -> None:
        """The outcome of a decisions-topic record that is not a decision, by where it was
        (``topic/partition/offset``): hash only, as no decision id exists to stream."""
        self._r.hset(
            self._keys.outcomes(),
            f"record:{where}",
            json.dumps({"outcome": outcome, "reason": reason, "atMs": now_ms}),
        )

    def tail(self, n: int) -> list[dict[str, str]]:
        """The ``n`` newest stream entries, newest first."""
        entries = self._r.xrevrange(self._keys.outcome_stream(), count=max(1, n))
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]

    def read_after(self, last_id: str, count: int = 1000) -> list[tuple[str, dict[bytes, bytes]]]:
        """Stream entries after entry id ``last_id`` (``-``: from the start), oldest first."""
        start = "-" if last_id == "-" else f"({last_id}"
        entries = self._r.xrange(self._keys.outcome_stream(), min=start, max="+", count=count)
        return [(i.decode() if isinstance(i, bytes) else i, fields) for i, fields in entries]


class MemoryOutcomeLog:
    """``OutcomeRecords`` in process memory: the record script's rules under one lock.

    Why: the fast simulator applies thousands of decisions through ``controller.apply`` and has
    no Redis; de-duplication and the first-outcome-wins rule must still be the product's. The
    stream keeps the newest ``OUTCOME_STREAM_MAXLEN`` entries, as the Redis stream is capped.
    """

    def __init__(self, maxlen: int = OUTCOME_STREAM_MAXLEN) -> None:
        self._lock = threading.Lock()
        self._hash: dict[str, dict[str, Any]] = {}
        self._stream: collections.deque[dict[str, str]] = collections.deque(maxlen=maxlen)

    def get(self, decision_id: str) -> dict[str, Any] | None:
        with self._lock:
            doc = self._hash.get(decision_id)
            return None if doc is None else copy.deepcopy(doc)

    def record(self, d: Decision, outcome: str, reason: str, now_ms: int) -> str:
        doc = {"outcome": str(outcome), "reason": reason, "kind": str(d.kind),
               "bundle": d.bundle, "atMs": now_ms}  # fmt: skip
        fields = _stream_entry(d, outcome, reason, now_ms)
        with self._lock:
            cur = self._hash.get(d.id)
            first = ""
            if cur is not None and cur["outcome"] not in ("dry_run", "conflict"):
                first = cur["outcome"]
            if first == "already_satisfied" and str(outcome) == "applied":  # see _LUA_RECORD
                fields += ["race", first]
                first = ""
            if not first:
                self._hash[d.id] = doc
            else:
                fields[3] = "conflict"
                fields += ["race", first]
            self._append(fields)
        return first

    def stream_only(self, d: Decision, outcome: str, reason: str, now_ms: int) -> None:
        with self._lock:
            self._append(_stream_entry(d, outcome, reason, now_ms))

    def _append(self, fields: list[str]) -> None:
        self._stream.append({str(k): str(v) for k, v in zip(fields[::2], fields[1::2])})

    def tail(self, n: int) -> list[dict[str, str]]:
        """The ``n`` newest stream entries, newest first (as ``OutcomeLog.tail``)."""
        with self._lock:
            return [dict(e) for e in list(self._stream)[::-1][: max(1, n)]]
