"""`nxctl run MODEL [PROMPT]`: one chat turn (or a raw completion), tokens printed as they come."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.drive import Arrival, drive
from engine.errors import NxError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from nxctl.commands.common import fail
from nxctl.commands.engine_options import EngineFlags, with_engine_options

if TYPE_CHECKING:
    from engine.llm import LLM


def stream_turn(
    llm: LLM,
    prompt: str,
    params: SamplingParams,
    raw: bool,
    write: Callable[[str], object] | None = None,
) -> str:
    """Generate one turn, writing text deltas as they come (to stdout by default); returns the whole text."""
    write = write or sys.stdout.write
    tokenizer = llm.tokenizer
    ids = tokenizer.encode(prompt) if raw else tokenizer.encode_chat([{"role": "user", "content": prompt}])
    shown = ""

    def show(out: RequestOutput) -> None:
        nonlocal shown
        write(out.text[len(shown) :])
        shown = out.text
        sys.stdout.flush()

    final = drive(llm.engine, [Arrival(ids, params)], on_output=show).outputs()[0]
    if final.finish_reason == "error":
        raise NxError(final.error or "generation failed")
    return shown


RUN_DEFAULTS: dict[str, Any] = {"max_tokens": 256, "temperature": 0.0, "top_k": 0, "top_p": 1.0}


def grammar_option(json_schema: Path | None, regex: str | None, json_object: bool) -> Grammar | None:
    """The one output constraint asked for on the command line (a NxError when more than one is)."""
    if sum((json_schema is not None, regex is not None, json_object)) > 1:
        raise NxError("give at most one of --json-schema, --regex and --json")
    if json_schema is not None:
        try:
            return Grammar.json_schema(json.loads(json_schema.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise NxError(f"cannot read the JSON schema {json_schema.name}: {exc}") from exc
    if regex is not None:
        return Grammar.regex(regex)
    return Grammar.json_object() if json_object else None


@with_engine_options
def run(
    engine: EngineFlags,
    model: Annotated[
        str, typer.Argument(help="A named model (smollm2, tiny), a model folder or a .gguf file.")
    ],
    prompt: Annotated[str | None, typer.Argument(help="The prompt; read from stdin when omitted.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="A plain completion instead of a chat turn.")] = False,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", "-n", help="Most tokens to generate [default: 256].")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy [default: 0].")] = None,
    top_k: Annotated[
        int | None, typer.Option(help="Keep the k most likely tokens (0 = off) [default: 0].")
    ] = None,
    top_p: Annotated[
        float | None, typer.Option(help="Nucleus sampling mass, in (0, 1] [default: 1].")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of this request's random stream.")] = None,
    json_schema: Annotated[
        Path | None,
        typer.Option("--json-schema", help="A JSON Schema file the answer must validate against."),
    ] = None,
    regex: Annotated[
        str | None, typer.Option("--regex", help="A regular expression the answer must match.")
    ] = None,
    json_object: Annotated[bool, typer.Option("--json", help="The answer is a JSON object.")] = False,
) -> None:
    """One chat turn with a model, printed as it is generated. A model Ollama pulled brings its
    manifest's stop words and parameters, which options given here override."""
    if prompt is None:
        if sys.stdin.isatty():
            fail("give a prompt, or pipe one on stdin")
        prompt = sys.stdin.read()
    if not prompt.strip():
        fail("the prompt is empty")
    given = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
    }
    chosen: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    try:
        grammar = grammar_option(json_schema, regex, json_object)
        if grammar is not None:
            chosen["grammar"] = grammar
        dataclasses.replace(SamplingParams(), **{**RUN_DEFAULTS, **chosen})  # bad values fail before loading
        from engine.llm import LLM  # noqa: PLC0415 - torch loads when a model runs, not for every nxctl command

        llm = LLM(model, **engine.settings.as_fields())
        if grammar is not None:
            llm.engine.grammars.compile(grammar)  # a grammar that does not compile: one line, no output
        settings: dict[str, Any] = {**RUN_DEFAULTS, **llm.source.defaults, **chosen}
        params = dataclasses.replace(SamplingParams(), **settings, stop=llm.source.stop)
        stream_turn(llm, prompt, params, raw)
    except NxError as exc:
        fail(str(exc))
    typer.echo("")
