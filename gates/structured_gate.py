"""Gate `structured`: grammar-constrained output is valid on every try, and constraining keeps batch
invariance.

On the random-weight `tiny` only the grammar can make output valid, so validity there is the mask's
doing. Checks: drawn JSON-schema requests (nested objects, enums, bounded strings, integers and
arrays, ``$ref``, ``anyOf``) all validate; drawn regex and choice requests all match; requests that
must call a tool (Hermes and Llama 3 formats) give calls that parse and validate against the tool's
schema; in a mixed batch of constrained and free requests every request keeps the bits of its solo
run. Negative control: the
same requests with the mask switched off (a documented fault hook) must be caught as invalid.
Cases derive from the gate seed (NXCTL_GATE_SEED), as the invariance gate's do.
"""

from __future__ import annotations

import random
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import testing
from engine.llm import LLM
from engine.llm_engine import Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.structured import Grammar
from engine.structured.tools import HERMES, LLAMA3, Tool, parse_tool_calls, takes_many_calls, tool_grammar
from gates.framework import Gate, GateRun
from gates.runs import run_solo, run_together, same
from gates.seed import gate_seed

MODEL = "tiny"
EMAIL = r"[a-z]{1,10}@[a-z]{2,8}\.(com|org|net)"
CHOICES = ["red", "green", "blue", "cyan or magenta"]


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sku: Annotated[str, Field(max_length=6)]
    quantity: Annotated[int, Field(ge=1, le=99)]


class Order(BaseModel):
    """The gate's schema: every kind of constraint the OpenAI and Ollama clients send."""

    model_config = ConfigDict(extra="forbid")
    customer: Annotated[str, Field(max_length=16)]
    status: Literal["new", "paid", "shipped"]
    priority: Annotated[int, Field(ge=0, le=5)]
    items: Annotated[list[Item], Field(max_length=3)]
    note: Annotated[str, Field(max_length=10)] | None


def _valid(kind: str, out: RequestOutput) -> bool:
    """Whether the output is complete and matches its grammar."""
    if out.finish_reason != "stop":
        return False
    if kind == "json":
        try:
            Order.model_validate_json(out.text)
        except ValidationError:
            return False
        return True
    if kind == "regex":
        return re.fullmatch(EMAIL, out.text) is not None
    return out.text in CHOICES


def _draw(rng: random.Random, vocab: int, n: int) -> list[tuple[str, list[int], SamplingParams]]:
    """``n`` requests: a grammar kind, a prompt and sampling settings (greedy or seeded sampling)."""
    grammars = {"json": Grammar.json_schema(Order.model_json_schema()), "regex": Grammar.regex(EMAIL)}
    grammars["choice"] = Grammar.choice(CHOICES)
    cases = []
    for i in range(n):
        kind = ("json", "json", "regex", "choice")[i % 4]
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 40))]
        temperature = rng.choice([0.0, 0.7, 1.0, 1.3])
        params = SamplingParams(
            max_tokens=320,
            temperature=temperature,
            seed=rng.randrange(2**31),
            grammar=grammars[kind],
            logprobs=0,
        )
        cases.append((kind, prompt, params))
    return cases


def _invalid_count(pair: tuple[list[str], list[RequestOutput]]) -> int:
    kinds, outs = pair
    return sum(not _valid(kind, out) for kind, out in zip(kinds, outs, strict=True))


def _any_invalid(pair: tuple[list[str], list[RequestOutput]]) -> bool:
    return _invalid_count(pair) > 0


def _tool_checks(run: GateRun, engine: Engine, rng: random.Random, seed: int) -> None:
    """Requests that must call a tool: every call parses, names a tool and validates."""
    tools = [
        Tool("order", "Place an order", Order.model_json_schema()),
        Tool("item", "Add an item", Item.model_json_schema()),
    ]
    models: dict[str, type[BaseModel]] = {"order": Order, "item": Item}
    cases = []
    for i in range(12):
        fmt = (HERMES, LLAMA3)[i % 2]
        choice = rng.choice(["required", "order", "item"])
        many = takes_many_calls(fmt, choice, parallel=bool(i % 3))
        grammar = tool_grammar(tools, choice, fmt, parallel=bool(i % 3))
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(2, 30))]
        params = SamplingParams(
            max_tokens=400, temperature=rng.choice([0.0, 1.0]), seed=rng.randrange(2**31), grammar=grammar
        )
        cases.append((fmt, choice, prompt, params, many))
    outs = run_together(engine, [(prompt, params) for _, _, prompt, params, _ in cases])
    good = cut = 0
    for (fmt, choice, _, _, many), out in zip(cases, outs, strict=True):
        rest, calls = parse_tool_calls(out.text, fmt, list(models))
        try:
            for call in calls:
                models[call.name].model_validate_json(call.arguments)
        except ValidationError:
            continue
        # parallel calls have no bound: a random-weight model may keep calling until max_tokens; its
        # complete calls must still validate and what is left must be the next call begun, or nothing
        # when max_tokens fell just after a call (one call alone fits max_tokens, so there is one
        # complete call at least)
        stopped = out.finish_reason == "stop" and not rest
        next_begun = not rest or rest.startswith(fmt.open.strip())
        ended = stopped or (out.finish_reason == "length" and many and next_begun)
        cut += ended and out.finish_reason == "length"
        good += bool(calls) and ended and (choice == "required" or {c.name for c in calls} == {choice})
    run.check(
        "structured.tool_calls",
        good == len(cases),
        f"{len(cases)}/{len(cases)} answers are calls that validate",
        f"{good}/{len(cases)} ({cut} parallel answers ran to max_tokens after complete calls)",
        f"seed {seed}; tool_choice required or named, Hermes and Llama 3 formats, one batch",
    )


def _body(run: GateRun) -> None:
    seed = gate_seed()
    rng = random.Random(f"{seed}:structured")
    llm = LLM(MODEL, num_kv_blocks=512)
    engine = llm.engine
    cases = _draw(rng, llm.model_config.vocab_size, 24)
    kinds = [kind for kind, _, _ in cases]
    outs = run_together(engine, [(prompt, params) for _, prompt, params in cases])
    bad = _invalid_count((kinds, outs))
    run.check(
        "structured.valid",
        bad == 0,
        "24/24 complete and valid",
        f"{24 - bad}/24 valid ({kinds.count('json')} JSON schema, {kinds.count('regex')} regex, "
        f"{kinds.count('choice')} choice)",
        f"seed {seed}; random-weight {MODEL}, greedy and sampled, all in one batch",
    )
    # a mixed batch: the same constrained requests beside as many free ones, each against its solo run
    free = [
        (
            prompt,
            SamplingParams(
                max_tokens=rng.randint(8, 48), temperature=params.temperature, seed=params.seed, logprobs=0
            ),
        )
        for _, prompt, params in cases[:12]
    ]
    mixed = [(prompt, params) for _, prompt, params in cases[:12]] + free
    rng.shuffle(mixed)
    together = run_together(engine, mixed)
    differ = sum(not same(run_solo(engine, p, sp), t) for (p, sp), t in zip(mixed, together, strict=True))
    run.check(
        "structured.invariance",
        differ == 0,
        "every request's tokens and logprob bits equal its solo run",
        f"{differ}/{len(mixed)} differ",
        f"seed {seed}; 12 constrained and 12 free requests in one batch, shuffled",
    )
    _tool_checks(run, engine, rng, seed)
    with testing.grammar_mask_off(engine):
        unmasked = run_together(engine, [(prompt, params) for _, prompt, params in cases])
    run.negative(
        "structured.neg.mask_off",
        _any_invalid,
        broken=(kinds, unmasked),
        honest=(kinds, outs),
        observed=f"{_invalid_count((kinds, unmasked))}/24 invalid with the mask off",
        detail="the same 24 requests, the grammar mask switched off",
    )


GATE = Gate(
    name="structured",
    summary="constrained output valid on every try, batch invariance kept",
    checks=("structured.valid", "structured.invariance", "structured.tool_calls", "structured.neg.mask_off"),
    body=_body,
)
