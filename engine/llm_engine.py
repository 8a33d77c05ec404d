"""Engine (add_request / step / abort) and LLM (generate / chat): the Python API every other part uses."""

from __future__ import annotations

import itertools
import random
import time
import uuid
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from engine.config import EngineConfig, ModelConfig, resolve_device
from engine.errors import CapacityError, InvalidRequestError
from engine.kv.block_pool import BlockPool
from engine.kv.cache import KVCache
from engine.layers.sampler import sample
from engine.loader import ChatTokenizer, IncrementalDetokenizer, LoadedModel, load_model
from engine.model_runner import ModelRunner
from engine.models.llama import Faults, PagedLlama
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence, Status


@dataclass
class EngineStats:
    """Counters over the engine's life, for gates, metrics and the bench (read-only to callers)."""

    steps: int = 0
    tokens_computed: int = 0
    tokens_generated: int = 0
    max_requests_in_step: int = 0
    mixed_steps: int = 0  # steps that ran decodes and prefill chunks together
    joins_mid_flight: int = 0  # requests admitted while others were already running
    chunked_prompts: int = 0  # requests whose prompt took more than one step


class Engine:
    """Continuous-batching engine over one model. Not thread-safe: one caller drives ``step()``.

    ``add_request`` may be called between any two steps; each ``step()`` runs ONE batched forward
    advancing every scheduled request, and returns one RequestOutput per request that produced a
    token or finished in that step.
    """

    def __init__(self, loaded: LoadedModel, config: EngineConfig):
        self.config = config
        self.model_config: ModelConfig = loaded.config
        self.tokenizer: ChatTokenizer = loaded.tokenizer
        self.model_name = loaded.source.name
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        self.faults = Faults()
        self.model = PagedLlama(
            loaded.config,
            loaded.weights,
            config.torch_dtype,
            self.device,
            config.batch_invariant,
            self.faults,
        )
        self.kv = KVCache(
            loaded.config, config.num_kv_blocks, config.block_size, config.torch_dtype, self.device
        )
        self.pool = BlockPool(config.num_kv_blocks, config.block_size)
        model_key = f"{loaded.source.path}:{config.dtype}:{config.batch_invariant}"
        self.scheduler = Scheduler(config, self.pool, model_key)
        self.runner = ModelRunner(self.model, self.kv)
        self.requests: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self.stats = EngineStats()
        self.stop_token_ids = frozenset(loaded.tokenizer.stop_token_ids)

    @property
    def capacity_tokens(self) -> int:
        return self.config.num_kv_blocks * self.config.block_size

    def add_request(
        self,
        prompt_token_ids: Seq[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
    ) -> str:
        """Queue a request (mutates); raises InvalidRequestError / CapacityError for requests that can never run."""
        params = params or SamplingParams()
        ids = [int(t) for t in prompt_token_ids]
        context = self.model_config.max_position_embeddings
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        if any(t < 0 or t >= self.model_config.vocab_size for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        if len(ids) >= context:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens; this model's context is {context} tokens"
            )
        total = min(len(ids) + params.max_tokens, context)
        if total > self.capacity_tokens:
            raise CapacityError(
                f"the request needs up to {total} tokens of KV cache; the whole pool holds {self.capacity_tokens}"
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**63)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            generator=generator,
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            max_total_tokens=total,
            arrival_time=time.perf_counter(),
            arrival_seq=next(self._arrivals),
            priority=priority,
            tenant=tenant or "default",
        )
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free everything it held (mutates); returns its final output, if it existed."""
        seq = self.requests.get(request_id)
        if seq is None or seq.finished:
            return None
        self._finish(seq, "abort")
        return self._output(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one batched forward over the scheduled requests; return outputs of those that advanced."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        self._count(out)
        logits, rows = self.runner.run(out)
        now = time.perf_counter()
        results: list[RequestOutput] = []
        for item, row in zip(out.scheduled, rows, strict=True):
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            self.scheduler.register_computed(seq)
            self.scheduler.charge(seq, item.num_new_tokens, row is not None)
            if row is None:
                continue
            try:
                self._append_token(seq, logits[row], now)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not take down the batch
                seq.error = f"{type(exc).__name__}: {exc}"
                self._finish(seq, "error")
            results.append(self._output(seq))
        return results

    def _count(self, out: SchedulerOutput) -> None:
        st = self.stats
        st.steps += 1
        st.tokens_computed += out.num_tokens
        st.max_requests_in_step = max(st.max_requests_in_step, len(out.scheduled))
        sizes = [s.num_new_tokens for s in out.scheduled]
        st.mixed_steps += 1 in sizes and any(n > 1 for n in sizes)
        started = [s.seq for s in out.scheduled if s.seq.num_computed_tokens > s.seq.num_cached_tokens]
        for item in out.scheduled:
            seq = item.seq
            if seq.num_computed_tokens == seq.num_cached_tokens and not seq.output_token_ids:
                st.joins_mid_flight += any(other is not seq for other in started)
                st.chunked_prompts += item.num_new_tokens < seq.num_uncomputed

    def _append_token(self, seq: Sequence, logits: torch.Tensor, now: float) -> None:
        if seq.request_id in self.faults.fail_requests:
            raise RuntimeError("injected failure")
        choice = sample(logits, seq.params, seq.generator, seq.prompt_token_ids, seq.output_token_ids)
        seq.output_token_ids.append(choice.token_id)
        self.stats.tokens_generated += 1
        seq.logprobs.append(choice.logprob)
        if seq.params.logprobs:
            seq.top_logprobs.append(choice.top)
        seq.token_times.append(now)
        if seq.first_token_time is None:
            seq.first_token_time = now
        is_stop_token = choice.token_id in self.stop_token_ids and not seq.params.ignore_eos
        if not is_stop_token:
            seq.text += seq.detokenizer.push([choice.token_id])
        reason = self._stop_reason(seq, is_stop_token)
        if reason is not None:
            if reason == "length" or is_stop_token:
                seq.text += seq.detokenizer.flush() if not is_stop_token else ""
            self._finish(seq, reason)

    def _stop_reason(self, seq: Sequence, is_stop_token: bool) -> str | None:
        if is_stop_token:
            return "stop"
        for stop in seq.params.stop:
            cut = seq.text.find(stop)
            if cut >= 0:
                seq.text = seq.text[:cut]
                return "stop"
        if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= seq.max_total_tokens:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.status = Status.FINISHED
        seq.finish_time = time.perf_counter()
        self.scheduler.remove(seq)

    def _output(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=list(seq.prompt_token_ids),
            token_ids=list(seq.output_token_ids),
            text=seq.text,
            finish_reason=seq.finish_reason,
            error=seq.error,
            logprobs=list(seq.logprobs),
            top_logprobs=[list(t) for t in seq.top_logprobs],
            num_cached_tokens=seq.num_cached_tokens,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
            token_times=list(seq.token_times),
        )

    def release_finished(self, request_id: str) -> None:
        """Forget a finished request's bookkeeping (mutates)."""
        seq = self.requests.get(request_id)
        if seq is not None and seq.finished:
            del self.requests[request_id]


class LLM:
    """Load a model and generate: ``LLM("smollm2").chat(messages, SamplingParams(max_tokens=32))``."""

    def __init__(
        self,
        model: str,
        dtype: str = "float32",
        device: str = "auto",
        batch_invariant: bool = True,
        **engine_config: object,
    ):
        self.config = EngineConfig(
            dtype=dtype, device=device, batch_invariant=batch_invariant, **engine_config
        )
        loaded = load_model(model)
        self.model_config: ModelConfig = loaded.config
        self.tokenizer: ChatTokenizer = loaded.tokenizer
        self.source = loaded.source
        self.engine = Engine(loaded, self.config)

    def generate(
        self, prompts: str | list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion, batched; outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        request_ids = [self.engine.add_request(p, params) for p in ids]
        return self._run(request_ids)

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None) -> RequestOutput:
        """One assistant turn for ``messages`` rendered with the model's chat template."""
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
        return self._run([self.engine.add_request(ids, params)])[0]

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        wanted = set(request_ids)
        while wanted - final.keys():
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
        for rid in request_ids:
            self.engine.release_finished(rid)
        return [final[r] for r in request_ids]
