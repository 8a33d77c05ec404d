"""The dead-letter store: requests that failed on the server's side, kept in SQLite for listing and replay.

One row per failed request: when, which model, the method and path, the status it was answered with,
the reason, and its body (unless the store redacts bodies). The store keeps at most ``max_rows`` rows,
dropping the oldest. Client errors (4xx) are never recorded here. Each call opens its own connection,
so the store is safe to use from any thread or process.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.errors import InvalidRequestError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    model TEXT,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    body BLOB,
    redacted INTEGER NOT NULL DEFAULT 0,
    replays INTEGER NOT NULL DEFAULT 0,
    last_replay_status INTEGER,
    last_replay_at REAL
)
"""


@dataclass(frozen=True)
class DeadLetter:
    """One recorded failure. ``body`` is None when the store redacts bodies."""

    id: int
    created: float
    model: str | None
    method: str
    path: str
    status: int
    reason: str
    body: bytes | None
    redacted: bool
    replays: int
    last_replay_status: int | None


class DeadLetterStore:
    """An SQLite file of dead letters, bounded by ``max_rows``; ``redact`` stores no bodies."""

    def __init__(self, path: Path, max_rows: int = 10_000, redact: bool = False) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        self.path = Path(path)
        self.max_rows = max_rows
        self.redact = redact
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def record(
        self, *, method: str, path: str, status: int, reason: str, model: str | None, body: bytes | None
    ) -> int:
        """Store one failure (mutates; trims to ``max_rows``); returns its id."""
        stored = None if self.redact else body
        with self._lock, closing(self._connect()) as db, db:
            cur = db.execute(
                "INSERT INTO dead_letters (created, model, method, path, status, reason, body, redacted)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (time.time(), model, method, path, status, reason[:2000], stored, int(self.redact)),
            )
            row_id = int(cur.lastrowid or 0)
            db.execute("DELETE FROM dead_letters WHERE id <= ?", (row_id - self.max_rows,))
        return row_id

    def list(self, limit: int = 50) -> list[DeadLetter]:
        """The newest ``limit`` dead letters, newest first."""
        with closing(self._connect()) as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM dead_letters ORDER BY id DESC LIMIT ?", (limit,))
            return [_letter(r) for r in rows.fetchall()]

    def get(self, letter_id: int) -> DeadLetter | None:
        with closing(self._connect()) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM dead_letters WHERE id = ?", (letter_id,)).fetchone()
        return None if row is None else _letter(row)

    def count(self) -> int:
        with closing(self._connect()) as db:
            return int(db.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0])

    def mark_replayed(self, letter_id: int, status: int) -> None:
        """Note a replay and the status it got (mutates)."""
        with self._lock, closing(self._connect()) as db, db:
            db.execute(
                "UPDATE dead_letters SET replays = replays + 1, last_replay_status = ?, last_replay_at = ?"
                " WHERE id = ?",
                (status, time.time(), letter_id),
            )


_COLUMNS = "id, created, model, method, path, status, reason, body, redacted, replays, last_replay_status"


def _letter(row: tuple) -> DeadLetter:
    body = row[7]
    return DeadLetter(
        id=row[0],
        created=row[1],
        model=row[2],
        method=row[3],
        path=row[4],
        status=row[5],
        reason=row[6],
        body=None if body is None else bytes(body),
        redacted=bool(row[8]),
        replays=row[9],
        last_replay_status=row[10],
    )


def replay_letter(
    store: DeadLetterStore, letter_id: int, url: str, api_key: str | None = None, timeout: float = 600.0
) -> tuple[int, str]:
    """Send dead letter ``letter_id`` to the seat at ``url`` again; notes the replay; returns (status, body)."""
    letter = store.get(letter_id)
    if letter is None:
        raise InvalidRequestError(f"no dead letter {letter_id} in {store.path}")
    if letter.body is None:
        raise InvalidRequestError(
            f"dead letter {letter_id} has no body (the seat redacted it): it cannot be replayed"
        )
    headers = {"content-type": "application/json", "x-nxctl-replay-of": str(letter_id)}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    response = httpx.request(
        letter.method, url.rstrip("/") + letter.path, content=letter.body, headers=headers, timeout=timeout
    )
    store.mark_replayed(letter_id, response.status_code)
    return response.status_code, response.text
