"""The dead-letter document the streaming job writes for a rejected record."""

from __future__ import annotations


def test_a_dead_letter_keeps_at_most_1_kib_of_a_hostile_key_and_says_how_long_it_was() -> None:
    import json

    from streaming.parse import DEAD_LETTER_MAX_KEY_BYTES, dead_letter

    doc = json.loads(dead_letter(b"{}", b"k" * 5_000_000, "t", 0, 7, 1, "key", "too long"))
    assert len(doc["key"]) == DEAD_LETTER_MAX_KEY_BYTES
    assert doc["keyBytes"] == 5_000_000
