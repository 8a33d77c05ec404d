"""The Hugging Face transformers peer: ``generate`` in static, left-padded batches on the same workload.

Each batch (``batch_size`` requests in arrival order, started once the previous batch finished and its
last member arrived) is padded on the left to its longest prompt with an attention mask and generated
greedily with min_new_tokens = max_new_tokens = its longest output. A streamer records when each decode
step's tokens come out, so TTFT and ITL are measured per request (a batch's first step ends its prefill);
a request completes when its batch completes, and only its requested tokens count as output.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.errors import NxError
from engine.loader import ModelSource
from engine.workload import WorkloadRequest
from nxctl.bench.machine import WorkCount, attended_keys
from nxctl.bench.schedules import Advance, ScheduleRun
from nxctl.bench.serving_metrics import RequestRecord


def load_hf_model(source: ModelSource, dtype: torch.dtype, device: torch.device) -> Any:
    """The same model through transformers (a .gguf file via ``gguf_file=``); NxError when it is missing."""
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging
    except ImportError:
        raise NxError("--peer hf needs transformers: pip install 'nxctl[peer]'") from None
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    model: Any  # transformers' own annotations of from_pretrained(...).to() do not type-check
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' GGUF converter draws its own tqdm bar
        if source.kind == "gguf":
            model = AutoModelForCausalLM.from_pretrained(
                source.path.parent, gguf_file=source.path.name, dtype=dtype
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype)
    return model.to(device).eval()


class StepTimes:
    """A generate() streamer recording when each step's tokens arrive (the first put is the prompt);
    ``on_step(k)`` is called after step k (0-based), for progress."""

    def __init__(self, on_step: Callable[[int], object] = lambda k: None) -> None:
        self.times: list[float] = []
        self._saw_prompt = False
        self._on_step = on_step

    def put(self, value: torch.Tensor) -> None:
        if not self._saw_prompt:
            self._saw_prompt = True
            return
        self.times.append(time.perf_counter())
        self._on_step(len(self.times) - 1)

    def end(self) -> None:
        """Nothing to flush."""


def _pad_id(model: Any) -> int:
    """The model's pad token, else its EOS, else 0 (padded positions are masked out either way)."""
    config = model.generation_config
    for candidate in (config.pad_token_id, config.eos_token_id, 0):
        if isinstance(candidate, list | tuple):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    return 0


def generate_batch(
    model: Any, batch: Sequence[WorkloadRequest], pad_id: int, advance: Advance
) -> tuple[list[list[int]], list[float]]:
    """Greedy ``generate`` of one left-padded batch; returns each row's new token ids and the step times."""
    from transformers import GenerationConfig

    width = max(len(r.prompt_token_ids) for r in batch)
    longest = max(r.output_len for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, width]
    mask = torch.zeros((len(batch), width), dtype=torch.long)  # [B, width]
    for row, req in enumerate(batch):
        n = len(req.prompt_token_ids)
        ids[row, width - n :] = torch.tensor(req.prompt_token_ids)
        mask[row, width - n :] = 1
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=longest,
        min_new_tokens=longest,
        pad_token_id=pad_id,
        eos_token_id=None,
    )
    streamer = StepTimes(lambda k: advance(sum(r.output_len > k for r in batch)))
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            generation_config=config,
            streamer=streamer,
        )  # out: [B, width + longest]
    new = out[:, width:].tolist()
    if len(streamer.times) != longest or any(len(row) != longest for row in new):
        raise NxError(f"hf generate made {len(streamer.times)} steps, expected {longest}")
    return new, streamer.times


def run_hf(model: Any, requests: Sequence[WorkloadRequest], batch_size: int, advance: Advance) -> ScheduleRun:
    """The peer over the workload (see the module docstring)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    pad_id = _pad_id(model)
    records: list[RequestRecord] = []
    work = WorkCount(0, 0, 0)
    t0 = time.perf_counter()
    for first in range(0, len(ordered), batch_size):
        batch = ordered[first : first + batch_size]
        delay = t0 + batch[-1].arrival_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        new, times = generate_batch(model, batch, pad_id, advance)
        batch_end = time.perf_counter()
        width = max(len(r.prompt_token_ids) for r in batch)
        longest = len(times)
        rows = len(batch) * (width + longest - 1)
        work = work + WorkCount(
            rows, len(batch) * longest, len(batch) * attended_keys(0, width + longest - 1), longest
        )
        for req, tokens in zip(batch, new, strict=True):
            n = req.output_len
            records.append(
                RequestRecord(
                    arrival=t0 + req.arrival_s,
                    chunk_times=times[:n],
                    end=batch_end,
                    input_tokens=len(req.prompt_token_ids),
                    output_tokens=n,
                    tenant=req.tenant,
                    token_ids=tokens[:n],
                )
            )
    duration = max(r.end for r in records) - t0
    return ScheduleRun(records, duration, work)
