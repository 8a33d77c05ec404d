"""`nxctl dlq`: the seat's dead letters (requests that failed on the server's side).

nxctl dlq list [--db FILE] [--json]              reason, time, model, status, path, replays
nxctl dlq replay ID [--url URL] [--api-key KEY]  send a dead letter's request again and show the answer
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated

import httpx
import typer

from engine.errors import InvalidRequestError
from nxctl.commands.common import fail
from nxctl.server.dlq import DeadLetter, DeadLetterStore, replay_letter
from nxctl.server.settings import default_dlq_path

app = typer.Typer(help="Dead letters: requests that failed on the seat's side, listed and replayed.")
DEFAULT_URL = "http://127.0.0.1:11434"
DbOpt = Annotated[
    Path | None, typer.Option("--db", help="The dead-letter file (default: ~/.nxctl/dlq.sqlite).")
]


def open_store(db: Path | None) -> DeadLetterStore:
    path = db or default_dlq_path()
    if not path.is_file():
        raise InvalidRequestError(f"no dead-letter store at {path} (the seat creates it when it starts)")
    return DeadLetterStore(path)


def _row(letter: DeadLetter) -> dict[str, object]:
    return {
        "id": letter.id,
        "time": datetime.fromtimestamp(letter.created).isoformat(timespec="seconds"),
        "model": letter.model,
        "status": letter.status,
        "method": letter.method,
        "path": letter.path,
        "reason": letter.reason,
        "body": "redacted" if letter.redacted else f"{len(letter.body or b'')} bytes",
        "replays": letter.replays,
        "last_replay_status": letter.last_replay_status,
    }


@app.command("list")
def list_letters(
    db: DbOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the newest N.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List dead letters, newest first: id, time, model, status, path, reason, replays."""
    rows = [_row(letter) for letter in open_store(db).list(limit)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no dead letters")
        return
    typer.echo(f"{'id':>5}  {'time':<19}  {'model':<12} {'status':>6}  {'path':<22} {'replays':>7}  reason")
    for r in rows:
        line = (
            f"{r['id']:>5}  {r['time']:<19}  {str(r['model'] or '-'):<12} {r['status']:>6}  {r['path']:<22} "
        )
        typer.echo(line + f"{r['replays']:>7}  {' '.join(str(r['reason']).split())}")


@app.command("replay")
def replay(
    letter_id: Annotated[int, typer.Argument(help="The dead letter's id (see `nxctl dlq list`).")],
    url: Annotated[str, typer.Option("--url", help="The seat to send it to.")] = DEFAULT_URL,
    db: DbOpt = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="Bearer key, if the seat needs one.")
    ] = None,
) -> None:
    """Send a dead letter's request to the seat again; prints the status and the answer (exit 1 unless 2xx)."""
    store = open_store(db)
    try:
        status, body = replay_letter(store, letter_id, url, api_key)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the seat at {url}: {exc}")
    typer.echo(f"replay of dead letter {letter_id}: status {status}")
    typer.echo(body)
    if not 200 <= status < 300:
        raise typer.Exit(1)
