"""The engine's command-line options, made once from ``EngineSettings``' fields and shared by serve, run,
chat and sched bench: ``--dtype``, ``--quantize``, ``--activations``, ``--kv-cache-dtype``,
``--num-kv-blocks``, ``--block-size``, ``--speculative``, ``--num-speculative-tokens``, ``--draft-model``
(each field's name, its ``help`` and its default). A command decorated with ``with_engine_options``
declares ``engine: EngineFlags`` instead of those parameters and receives them checked."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from engine.errors import InvalidRequestError
from engine.settings import ENGINE_FLAGS, ENGINE_SETTING_NAMES, EngineSettings, flag_of
from nxctl.commands.common import fail

R = TypeVar("R")
_CONTEXT = "engine_options_context"


@dataclass(frozen=True)
class EngineFlags:
    """What a command got for the engine options: ``settings`` (every field, defaults filled, checked)
    and ``given``, the flags named on the command line (``--dtype``, ...), even at their default."""

    settings: EngineSettings
    given: frozenset[str] = frozenset()


def given_on_command_line(ctx: typer.Context, flags: tuple[str, ...]) -> frozenset[str]:
    """Those of ``flags`` (long option names) named on the command line of ``ctx``, not left at their
    default or taken from the environment (click's parameter source)."""
    sources = {flag: ctx.get_parameter_source(flag.lstrip("-").replace("-", "_")) for flag in flags}
    # by name: typer carries its own copy of click's ParameterSource
    return frozenset(
        flag for flag, source in sources.items() if getattr(source, "name", None) == "COMMANDLINE"
    )


def _option_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per EngineSettings field, annotated as a Typer option."""
    hints = get_type_hints(EngineSettings)
    return [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=f.default,
            annotation=Annotated[hints[f.name], typer.Option(flag_of(f.name), help=f.metadata["help"])],
        )
        for f in fields(EngineSettings)
    ]


def with_engine_options(command: Callable[..., R]) -> Callable[..., R]:
    """``command`` with the engine options added to its Typer parameters; it is called with
    ``engine=EngineFlags(...)`` in their place. A bad value is one line on stderr and exit 2, before the
    command runs."""
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()]
    own = [p for p in own if p.name != "engine"]
    # Typer hands its context to one parameter: the command's own, else one added here
    context = next((p.name for p in own if p.annotation is typer.Context), None)
    added = _option_parameters()
    if context is None:
        added.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    clashes = {p.name for p in own} & set(ENGINE_SETTING_NAMES)
    assert not clashes, f"{command.__name__} declares engine options itself: {sorted(clashes)}"

    @functools.wraps(command)
    def with_options(*args: Any, **kwargs: Any) -> R:
        values = {name: kwargs.pop(name) for name in ENGINE_SETTING_NAMES if name in kwargs}
        ctx = kwargs[context] if context else kwargs.pop(_CONTEXT)
        try:
            settings = EngineSettings(**values)
        except InvalidRequestError as exc:
            fail(str(exc))
        return command(
            *args, engine=EngineFlags(settings, given_on_command_line(ctx, ENGINE_FLAGS)), **kwargs
        )

    parameters = [p for p in own if p.kind != inspect.Parameter.KEYWORD_ONLY]
    parameters += added + [p for p in own if p.kind == inspect.Parameter.KEYWORD_ONLY]
    with_options.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in parameters} | {
        "return": hints.get("return")
    }
    del with_options.__wrapped__  # Typer reads the signature above, not the command's own
    return with_options
