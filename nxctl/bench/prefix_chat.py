"""The prefix-cache chat measurement: chat requests sharing one system prompt, with and without the cache.

Every request is a chat turn: the same system prompt of ``system_tokens`` tokens, then a user message
of ``user_min``..``user_max`` tokens, rendered with the model's chat template. Sent one after another
(each when the previous finished) and all at once (rate inf), first without the prefix cache, then
with it, on the same prompts; TTFT (time from add to first token) and output identity are reported.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from engine.drive import Arrival, drive
from engine.llm import LLM
from engine.llm_engine import Engine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from nxctl.bench.serving_metrics import percentile

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from one had by "
    "word but not what all were we when your can said there use an each which she do how their if will"
).split()


@dataclass(frozen=True)
class PrefixChatResult:
    mode: str  # "sequential" or "rate_inf"
    cache: bool
    ttft_ms_p50: float
    ttft_ms_p99: float
    cached_tokens: int


def _text_of(tokenizer, rng: random.Random, tokens: int) -> str:
    text = ""
    while len(tokenizer.encode(text)) < tokens:
        text += rng.choice(WORDS) + " "
    return tokenizer.decode(tokenizer.encode(text)[:tokens])


def chat_prompts(
    llm: LLM, count: int, system_tokens: int, user_min: int, user_max: int, seed: int
) -> list[list[int]]:
    rng = random.Random(seed)
    system = _text_of(llm.tokenizer, rng, system_tokens)
    prompts = []
    for _ in range(count):
        user = _text_of(llm.tokenizer, rng, rng.randint(user_min, user_max)).strip()
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        prompts.append(llm.tokenizer.encode_chat(messages))
    return prompts


def _run(
    engine: Engine, prompts: list[list[int]], sequential: bool, params: SamplingParams
) -> list[RequestOutput]:
    """Every prompt one after another (``sequential``) or all at once; outputs in prompt order."""
    if sequential:
        return [drive(engine, [Arrival(p, params)]).outputs()[0] for p in prompts]
    return drive(engine, [Arrival(p, params) for p in prompts]).outputs()


def _first_token_time(out: RequestOutput) -> float:
    assert out.first_token_time is not None, "every request here produces at least one token"
    return out.first_token_time


def measure(
    model: str,
    count: int = 32,
    system_tokens: int = 256,
    user_min: int = 16,
    user_max: int = 64,
    output_tokens: int = 16,
    seed: int = 0,
    dtype: str = "float32",
) -> tuple[list[PrefixChatResult], dict]:
    """Both modes, without then with the cache; returns the results and whether outputs were identical."""
    plain = LLM(model, dtype=dtype, enable_prefix_caching=False)
    cached = LLM(model, dtype=dtype)
    prompts = chat_prompts(cached, count, system_tokens, user_min, user_max, seed)
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True)
    results: list[PrefixChatResult] = []
    identical: dict[str, bool] = {}
    for mode in ("sequential", "rate_inf"):
        outs = {}
        for use_cache, llm in ((False, plain), (True, cached)):
            llm.engine.reset_prefix_cache()
            outs[use_cache] = _run(llm.engine, prompts, mode == "sequential", params)
            ttft = [(_first_token_time(o) - o.arrival_time) * 1000 for o in outs[use_cache]]
            results.append(
                PrefixChatResult(
                    mode,
                    use_cache,
                    statistics.median(ttft),
                    percentile(ttft, 99),
                    sum(o.num_cached_tokens for o in outs[use_cache]),
                )
            )
        identical[mode] = all(
            a.token_ids == b.token_ids and a.logprobs == b.logprobs
            for a, b in zip(outs[False], outs[True], strict=True)
        )
    return results, identical
