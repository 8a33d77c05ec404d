"""Shared CLI helpers: one clear line on stderr and a non-zero exit for bad input."""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import typer

QUANTIZE_HELP = (
    "auto: keep a GGUF's quantized weights quantized (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K); none: dequantize to --dtype; "
    "int8: also quantize float weights to Q8_0."
)

ACTIVATIONS_HELP = (
    "What quantized weights multiply on the CPU: float (the float32 inputs; outputs equal the float path's), "
    "int16 or int8 (inputs quantized per 32 to int16 or int8, exact integer dot products: faster, a little off "
    "the float path; int8 the fastest and the furthest), or mixed (int16, but int8 for a prompt's context rows "
    "outside q/k/v: faster prompts)."
)

KV_CACHE_DTYPE_HELP = (
    "What the KV cache holds: auto (float16 under quantized weights on the CPU, as llama.cpp's default cache; "
    "else the model's dtype), float32, bfloat16 or float16 (the model's dtype, or float16 under float32)."
)

# the --kv-cache-dtype option of serve, run and sched bench (EngineConfig.kv_cache_dtype)
KvCacheDtypeOption = Annotated[str, typer.Option("--kv-cache-dtype", help=KV_CACHE_DTYPE_HELP)]

SPECULATIVE_HELP = (
    "Speculative decoding, exact (outputs equal to the plain run's, bit for bit): ngram (prompt lookup) "
    "or draft (a draft model, --draft-model). Off by default."
)
DRAFT_MODEL_HELP = (
    "With --speculative draft: a model sharing the target's tokenizer, or layers:N (its first N layers)."
)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``nxctl: error: <message>`` as one line on stderr and exit with ``code``."""
    line = " ".join(str(message).split())
    typer.echo(f"nxctl: error: {line}", err=True)
    raise typer.Exit(code)


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()
