"""The `nxctl` command line: a thin registry of Typer sub-apps, one module per command group."""

from __future__ import annotations

import sys

import typer

from engine.errors import NxError
from nxctl.commands import census, chat, dlq, gate, model, mux, run, sched, serve

app = typer.Typer(
    name="nxctl",
    help="Serve language models on one machine: chat seat, capacity planning, scheduler bench, gates.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(model.app, name="model")
app.add_typer(mux.app, name="mux")
app.add_typer(sched.app, name="sched")
app.add_typer(dlq.app, name="dlq")
app.command("serve")(serve.serve)
app.command("chat")(chat.chat)
app.command("run")(run.run)
app.command("gate")(gate.gate)
app.command("census")(census.census)


def main() -> None:
    """Entry point: typed engine errors and unexpected failures become one line on stderr, never a traceback."""
    try:
        app()
    except NxError as exc:
        typer.echo(f"nxctl: error: {' '.join(str(exc).split())}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("nxctl: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - no traceback reaches a user
        typer.echo(f"nxctl: internal error: {type(exc).__name__}: {' '.join(str(exc).split())}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
