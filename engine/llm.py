"""LLM: load a model and generate, vLLM's offline entry point over one Engine (engine/llm_engine.py)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any, cast

from engine.config import EngineConfig
from engine.drive import Arrival, drive
from engine.errors import InvalidRequestError
from engine.llm_engine import Engine
from engine.loader import ChatTokenizer, load_model
from engine.memory import reclaim
from engine.model_config import ModelConfig
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    """Load a model and generate: ``LLM("smollm2").chat(messages, SamplingParams(max_tokens=32))``."""

    def __init__(
        self,
        model: str,
        dtype: str = "float32",
        device: str = "auto",
        batch_invariant: bool = True,
        **engine_config: Any,  # further EngineConfig fields; EngineConfig checks their values
    ):
        self.config = EngineConfig(
            dtype=dtype, device=device, batch_invariant=batch_invariant, **engine_config
        )
        loaded = load_model(model)
        self.model_config: ModelConfig = loaded.config
        self.tokenizer: ChatTokenizer = loaded.tokenizer
        self.source = loaded.source
        self.engine = Engine(loaded, self.config)
        del loaded  # the file's tensors: the engine holds its own packed copies now
        reclaim()  # give the loader's transient memory (parsed metadata, raw blocks) back to the system

    def generate(
        self,
        prompts: str | list[str] | list[int] | list[list[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion, batched; outputs in prompt order.
        ``params`` is one SamplingParams for all prompts or a list, one per prompt (as in vLLM)."""
        batch: Seq[str | list[int]]
        if isinstance(prompts, str):
            batch = [prompts]
        elif prompts and isinstance(prompts[0], int):
            batch = [cast("list[int]", prompts)]  # the declared lists are homogeneous: one prompt of ids
        else:
            batch = cast("list[str] | list[list[int]]", prompts)  # likewise: no item is an int
        ids = [self.tokenizer.encode_prompt(p) if isinstance(p, str) else list(p) for p in batch]
        if params is None or isinstance(params, SamplingParams):
            per_prompt = [params or SamplingParams()] * len(ids)
        else:
            per_prompt = list(params)
            if len(per_prompt) != len(ids):
                raise InvalidRequestError(
                    f"{len(per_prompt)} sampling params for {len(ids)} prompts: give one, or one per prompt"
                )
        return drive(self.engine, [Arrival(p, sp) for p, sp in zip(ids, per_prompt, strict=True)]).outputs()

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None) -> RequestOutput:
        """One assistant turn for ``messages`` rendered with the model's chat template."""
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
        return drive(self.engine, [Arrival(ids, params or SamplingParams())]).outputs()[0]
