"""The dead-letter store: bounded, redactable, readable from another connection."""

from __future__ import annotations

from pathlib import Path

from nxctl.server.dlq import DeadLetterStore


def record(store: DeadLetterStore, n: int) -> int:
    return store.record(
        method="POST", path="/api/chat", status=500, reason=f"failure {n}", model="m", body=b'{"n": %d}' % n
    )


def test_rows_are_kept_newest_first_and_bounded(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path / "d.sqlite", max_rows=3)
    ids = [record(store, n) for n in range(5)]
    letters = store.list()
    assert [lt.id for lt in letters] == ids[:1:-1]
    assert store.count() == 3 and letters[0].reason == "failure 4" and letters[0].body == b'{"n": 4}'
    assert store.get(ids[0]) is None


def test_redacted_store_keeps_no_body_and_replays_are_noted(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path / "d.sqlite", redact=True)
    letter_id = record(store, 1)
    store.mark_replayed(letter_id, 200)
    letter = DeadLetterStore(tmp_path / "d.sqlite").get(letter_id)  # another connection sees it
    assert letter is not None and letter.body is None and letter.redacted
    assert (letter.replays, letter.last_replay_status) == (1, 200)
