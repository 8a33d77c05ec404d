"""What grammar constraints cost: output tokens per second of JSON-schema requests against the same
requests unconstrained, in one run on one loaded model.

The constrained phase runs ``count`` chat requests under a JSON schema (all at once, continuous
batching) until each grammar completes; the free phase runs the same prompts without a grammar,
each generating exactly as many tokens as its constrained twin did (``ignore_eos``), so both phases
do the same forwards and differ only by the grammar's work. Phases alternate ``repeats`` times; the
medians are compared. The engine's counters say how long filling the masks took on the mask thread
and how much of that the steps waited for (the rest hid behind the forward).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from engine.drive import Arrival, drive
from engine.llm import LLM
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.structured import Grammar

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "interests": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "interests", "member"],
    "additionalProperties": False,
}
PEOPLE = ("a retired teacher", "a young pilot", "a chess player", "a baker", "a marine biologist", "a nurse")


@dataclass(frozen=True)
class StructuredCost:
    requests: int
    output_tokens: int  # per phase (both phases generate exactly these)
    free_tok_s: float  # medians over the repeats
    json_schema_tok_s: float
    ratio: float  # json_schema / free
    cost_pct: float  # 100 * (1 - ratio)
    valid: int  # constrained outputs that parse and validate (of ``requests``), first repeat
    mask_us_mean: float  # per mask, on the mask thread
    mask_hidden_pct: float  # share of the mask time hidden behind forwards
    repeats: int


def _prompts(llm: LLM, count: int) -> list[list[int]]:
    tok = llm.tokenizer
    return [
        tok.encode_chat(
            [
                {
                    "role": "user",
                    "content": f"Invent a profile for {PEOPLE[i % len(PEOPLE)]} (number {i}) as JSON with "
                    "name, age, city, interests and member.",
                }
            ]
        )
        for i in range(count)
    ]


def _valid(out: RequestOutput) -> bool:
    try:
        value = json.loads(out.text)
    except json.JSONDecodeError:
        return False
    return out.finish_reason == "stop" and isinstance(value, dict) and set(value) == set(SCHEMA["properties"])


def _phase(llm: LLM, arrivals: list[Arrival]) -> tuple[list[RequestOutput], float]:
    began = time.perf_counter()
    outs = drive(llm.engine, arrivals).outputs()
    return outs, time.perf_counter() - began


def measure(model: str, count: int = 16, max_tokens: int = 160, repeats: int = 3) -> StructuredCost:
    llm = LLM(model)
    prompts = _prompts(llm, count)
    grammar = Grammar.json_schema(SCHEMA)
    constrained = [Arrival(p, SamplingParams(max_tokens=max_tokens, grammar=grammar)) for p in prompts]
    llm.engine.grammars.compile(grammar)  # the one-off tokenizer set-up stays out of the timings
    first, _ = _phase(llm, constrained)  # warm-up, and the token count of each request
    lengths = [len(o.token_ids) for o in first]
    free = [
        Arrival(p, SamplingParams(max_tokens=n, ignore_eos=True))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    before = llm.engine.counters
    free_s, json_s = [], []
    for _ in range(repeats):
        json_s.append(_phase(llm, constrained)[1])
        free_s.append(_phase(llm, free)[1])
    after = llm.engine.counters
    tokens = sum(lengths)
    free_rate, json_rate = tokens / statistics.median(free_s), tokens / statistics.median(json_s)
    mask_s = after.grammar_mask_seconds - before.grammar_mask_seconds
    wait_s = after.grammar_wait_seconds - before.grammar_wait_seconds
    masks = after.grammar_masks - before.grammar_masks
    return StructuredCost(
        requests=count,
        output_tokens=tokens,
        free_tok_s=round(free_rate, 2),
        json_schema_tok_s=round(json_rate, 2),
        ratio=round(json_rate / free_rate, 4),
        cost_pct=round(100 * (1 - json_rate / free_rate), 2),
        valid=sum(_valid(o) for o in first),
        mask_us_mean=round(1e6 * mask_s / max(masks, 1), 1),
        mask_hidden_pct=round(100 * (1 - wait_s / mask_s), 1) if mask_s > 0 else 100.0,
        repeats=repeats,
    )


def as_json(result: StructuredCost) -> str:
    return json.dumps(asdict(result), indent=2)
