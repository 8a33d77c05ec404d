"""Engine (add_request / step / abort) and LLM (generate / chat): the Python API every other part uses."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import time
import uuid
from collections.abc import Callable
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from types import MappingProxyType
from typing import Any, cast

import torch

from engine.config import EngineConfig, ModelConfig, resolve_device
from engine.drive import Arrival, drive
from engine.errors import CapacityError, InvalidRequestError
from engine.kv.block_pool import BlockPool
from engine.kv.cache import KVCache
from engine.layers.sampler import Sample, SampleRequest, sample_batch
from engine.loader import ChatTokenizer, IncrementalDetokenizer, LoadedModel, load_model
from engine.model_runner import ModelRunner
from engine.models.llama import Faults, PagedLlama
from engine.mux.memory import reclaim
from engine.outputs import FinishReason, RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence, Status
from engine.snapshot import EngineCounters, EngineSnapshot, RequestView
from engine.spec.adaptive import SpecBackoff
from engine.spec.proposers import Proposer, make_proposer
from engine.spec.verifier import Verify, VerifyFaults, verify_run, verify_run_with_faults
from engine.stop_check import check_stop
from engine.structured import GrammarCompiler, GrammarMatcher, MaskWorker, TokenMask

# adds a sampled token (or the sampler's error) to its request: Engine._append_token, or under a fault hook
# a wrapper that fails named requests first
Append = Callable[[Sequence, Sample | Exception, float], None]


def rows_of(sampled: list[tuple[Sequence, int]]) -> list[int]:
    """The logits rows of the sampled requests, in order."""
    return [row for _, row in sampled]


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
        self._faults = Faults()
        self._model = PagedLlama(
            loaded.config,
            loaded.weights,
            config.torch_dtype,
            self.device,
            config.batch_invariant,
            self._faults,
            config.quantize,
            config.activations,
        )
        kv_dtype = config.kv_dtype(self._model.holds_quantized)
        self._kv = KVCache(loaded.config, config.num_kv_blocks, config.block_size, kv_dtype, self.device)
        self._pool = BlockPool(config.num_kv_blocks, config.block_size)
        model_key = f"{loaded.source.path}:{config.dtype}:{config.quantize}:{config.activations}:{kv_dtype}:{config.batch_invariant}"
        self._scheduler = Scheduler(
            config, self._pool, model_key, context_keyed=self._model.splits_context_rows
        )
        self._runner = ModelRunner(self._model, self._kv)
        self._requests: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._stats = EngineCounters()  # this engine's own, mutated each step; callers get copies
        self.stop_token_ids = frozenset(loaded.tokenizer.stop_token_ids)
        self.grammars = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
        self._masks = MaskWorker()
        self._spec = config.spec
        self._proposer: Proposer | None = make_proposer(self._spec, loaded, config)
        self._verify_faults: VerifyFaults | None = None  # the verifier's deliberate bugs (engine/testing.py)

    @property
    def capacity_tokens(self) -> int:
        return self.config.num_kv_blocks * self.config.block_size

    @property
    def kv_dtype(self) -> torch.dtype:
        """What the KV pool holds (EngineConfig.kv_cache_dtype resolved for this model)."""
        return self._kv.keys[0].dtype

    @property
    def context_tokens(self) -> int:
        """The longest a request may grow, prompt and output: the model's context, or
        ``EngineConfig.max_model_len`` where that is smaller."""
        context = self.model_config.max_position_embeddings
        return min(context, self.config.max_model_len or context)

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
        context = self.context_tokens
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        if any(t < 0 or t >= self.model_config.vocab_size for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        if len(ids) >= context:
            raise InvalidRequestError(f"the prompt has {len(ids)} tokens; the context is {context} tokens")
        if any(t >= self.model_config.vocab_size for t, _ in params.logit_bias):
            raise InvalidRequestError(f"logit_bias token ids must be in [0, {self.model_config.vocab_size})")
        matcher = self.grammars.matcher(params.grammar) if params.grammar is not None else None
        total = min(len(ids) + params.max_tokens, context)
        if total > self.capacity_tokens:
            raise CapacityError(
                f"the request needs up to {total} tokens of KV cache; the whole pool holds {self.capacity_tokens}"
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._requests:
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
            matcher=matcher,
        )
        self._requests[request_id] = seq
        self._scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free everything it held (mutates); returns its final output, if it existed."""
        seq = self._requests.get(request_id)
        if seq is None or seq.finished:
            return None
        self._finish(seq, "abort")
        return seq.output()

    def has_unfinished(self) -> bool:
        return self._scheduler.has_unfinished()

    @property
    def counters(self) -> EngineCounters:
        """A copy of the engine's life counters (steps, tokens, preemptions, ...)."""
        return dataclasses.replace(self._stats, preemptions=self._scheduler.num_preemptions)

    def snapshot(self, requests: bool = True) -> EngineSnapshot:
        """A read-only copy of the engine's state between two steps (queues, KV blocks, counters).
        ``requests=False`` leaves the per-request views out (empty): the cheap form for every step."""
        sched, pool = self._scheduler, self._pool
        return EngineSnapshot(
            waiting=tuple(s.request_id for s in sched.waiting),
            running=tuple(s.request_id for s in sched.running),
            requests=MappingProxyType(
                {rid: _view(seq) for rid, seq in self._requests.items()} if requests else {}
            ),
            block_size=pool.block_size,
            kv_blocks_total=pool.num_blocks,
            kv_blocks_used=pool.num_used,
            prefix_queries=pool.queries,
            prefix_hits=pool.hits,
            tenant_service=MappingProxyType(dict(sched.counters.served)),
            counters=self.counters,
            weight_bytes=self._model.weight_bytes,
            kv_bytes=self._kv.bytes,
        )

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix block (mutates; blocks in use stay with their requests)."""
        self._pool.reset_prefix_cache()

    def embed(self, token_lists: Seq[Seq[int]]) -> list[list[float]]:
        """One unit-length vector (hidden_size floats) per token list: the mean of the model's INPUT
        token embeddings over its tokens, L2-normalised. Reads weights only, so it may run on a thread
        beside the one stepping the engine. Raises InvalidRequestError for an empty list or a bad id."""
        vocab = self.model_config.vocab_size
        for ids in token_lists:
            if not ids or any(t < 0 or t >= vocab for t in ids):
                raise InvalidRequestError(f"every input needs at least one token id in [0, {vocab})")
        vectors = []
        with torch.no_grad():
            for ids in token_lists:
                index = torch.tensor(list(ids), dtype=torch.long, device=self.device)
                rows = self._model.embed_rows(index).float()  # [n, hidden]
                vectors.append(torch.nn.functional.normalize(rows.mean(dim=0), dim=0).cpu().tolist())
        return vectors

    def step(self) -> list[RequestOutput]:
        """Run one batched forward over the scheduled requests; return outputs of those that advanced."""
        if self._faults.active or self._verify_faults is not None:  # a step's one look at the fault hooks
            return self._step_under_faults()
        return self._step(self._append_token, verify_run)

    def _step_under_faults(self) -> list[RequestOutput]:
        """``step()`` with the switched-on hooks of engine/testing.py applied (the slow path, taken only
        while one is on): named requests fail when they sample, constrained requests run as if they had no
        grammar (their matchers set aside for the step), the verifier runs with its deliberate bugs."""
        faults, verify_faults = self._faults, self._verify_faults

        def append(seq: Sequence, choice: Sample | Exception, now: float) -> None:
            if seq.request_id in faults.fail_requests:
                raise RuntimeError("injected failure")
            self._append_token(seq, choice, now)

        verify: Verify = verify_run
        if verify_faults is not None:
            verify = functools.partial(verify_run_with_faults, faults=verify_faults)
        unmasked = (
            [s for s in self._requests.values() if s.matcher is not None] if faults.grammar_mask_off else []
        )
        matchers = [s.matcher for s in unmasked]
        for seq in unmasked:
            seq.matcher = None
        try:
            return self._step(append, verify)
        finally:
            for seq, matcher in zip(unmasked, matchers, strict=True):
                seq.matcher = matcher

    def _step(self, append: Append, verify: Verify) -> list[RequestOutput]:
        """``step()`` itself; ``append`` adds a sampled token to its request, ``verify`` walks a
        speculating request's rows (``verify_run``, or its faulty twin under a fault hook)."""
        self._propose()
        out = self._scheduler.schedule()
        self._forget_drafts(out.preempted)
        if not out.scheduled:
            return []
        self._count(out)
        # the grammar masks of the requests about to sample: filled during the forward when a core is
        # spare, else now (engine/structured/masks.py)
        constrained = self._constrained_samplers(out)
        pending = self._masks.start([matcher for _, matcher in constrained])
        logits, rows = self._runner.run(out)
        masks = self._collect_masks([seq for seq, _ in constrained], pending)
        now = time.perf_counter()
        sampled = [
            (item.seq, row)
            for item, row in zip(out.scheduled, rows, strict=True)
            if row is not None and not item.seq.draft_token_ids
        ]
        picked = rows_of(sampled)  # one batched sampling call for the step's sampled rows
        requests = [
            SampleRequest(s.params, s.generator, s.prompt_token_ids, s.output_token_ids, masks.get(id(s)))
            for s, _ in sampled
        ]
        choices = dict(zip(picked, sample_batch(logits[picked], requests), strict=True))
        results: list[RequestOutput] = []
        for item, row in zip(out.scheduled, rows, strict=True):
            seq = item.seq
            if seq.draft_token_ids and row is not None:
                results.append(self._verify(seq, logits, row, now, append, verify))
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self._scheduler.register_computed(seq)
            self._scheduler.charge(seq, item.num_new_tokens, row is not None)
            if row is None:
                continue
            try:
                append(seq, choices[row], now)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not take down the batch
                seq.error = f"{type(exc).__name__}: {exc}"
                self._finish(seq, "error")
            results.append(seq.output())
        return results

    def _propose(self) -> None:
        """Before scheduling: proposals for the running requests about to decode (mutates their
        ``draft_token_ids``). None while more requests decode than ``spec_max_batch`` and for requests
        their back-off pauses; never past max_tokens or the context, nor past what a request's grammar
        allows (its verify rows are then masked one by one, as its plain steps would be)."""
        if self._proposer is None:
            return
        decoding = [s for s in self._scheduler.running if s.is_decoding]
        for seq in decoding:
            seq.draft_token_ids = []
        if len(decoding) > self._spec.max_batch:
            return
        wanted: list[tuple[Sequence, int]] = []
        for seq in decoding:
            if seq.backoff is None:
                seq.backoff = SpecBackoff(self._spec.num_tokens)
            room = min(
                seq.params.max_tokens - len(seq.output_token_ids), seq.max_total_tokens - seq.num_tokens
            )
            n = min(seq.backoff.wants(), room - 1)
            if n > 0:
                wanted.append((seq, n))
        if wanted:
            for (seq, n), proposal in zip(wanted, self._proposer.propose(wanted), strict=True):
                if seq.matcher is not None:
                    allowed = proposal[: seq.matcher.allowed_prefix(proposal[:n])]
                    if proposal and not allowed:  # nothing to verify: the proposer drops what it drafted
                        self._proposer.verified(seq)
                    proposal = allowed
                seq.draft_token_ids = proposal[:n]

    def _forget_drafts(self, seqs: list[Sequence]) -> None:
        if self._proposer is not None:
            for seq in seqs:
                self._proposer.forget(seq)

    def _verify(
        self, seq: Sequence, logits: torch.Tensor, row: int, now: float, append: Append, verify: Verify
    ) -> RequestOutput:
        """Verify a speculating request's step (engine/spec/verifier.py): rows ``row - k .. row`` of
        ``logits`` follow its last token and its k proposals. Emits the tokens the plain path would
        (mutates), keeps the K/V of the rows that hold real tokens and gives back the rest."""
        proposals, seq.draft_token_ids = seq.draft_token_ids, []
        start, first = seq.num_computed_tokens, row - len(proposals)

        def sample_row(i: int) -> Sample:
            seq.num_computed_tokens = start + i + 1  # rows 0..i hold real tokens
            self._scheduler.register_computed(seq)
            request = SampleRequest(
                seq.params, seq.generator, seq.prompt_token_ids, seq.output_token_ids, self._row_mask(seq)
            )
            choice = sample_batch(logits[first + i : first + i + 1], [request])[0]
            if isinstance(choice, Exception):
                raise choice
            return choice

        def emit(choice: Sample) -> bool:
            append(seq, choice, now)
            return seq.finished

        try:
            verdict = verify(proposals, sample_row, emit)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not take down the batch
            seq.error = f"{type(exc).__name__}: {exc}"
            self._finish(seq, "error")
            return seq.output()
        self._scheduler.charge(seq, verdict.valid_rows, True)
        self._stats.count_verified(len(proposals), verdict.accepted)
        if seq.backoff is not None:
            seq.backoff.record(len(proposals), verdict.accepted)
        if not seq.finished:
            seq.num_computed_tokens = start + verdict.valid_rows
            self._scheduler.trim(seq)
            assert self._proposer is not None
            self._proposer.verified(seq)
        return seq.output()

    def _constrained_samplers(self, out: SchedulerOutput) -> list[tuple[Sequence, GrammarMatcher]]:
        """The step's requests that have a grammar and sample one token at its end (a verifying
        request's rows are masked one at a time, in ``_verify``)."""
        return [
            (s.seq, s.seq.matcher)
            for s in out.scheduled
            if s.seq.matcher is not None
            and s.num_new_tokens == s.seq.num_uncomputed
            and not s.seq.draft_token_ids
        ]

    def _row_mask(self, seq: Sequence) -> TokenMask | None:
        """A verifying request's mask for its next row, from its grammar's state now (None: no grammar)."""
        if seq.matcher is None:
            return None
        began = time.perf_counter()
        mask = TokenMask(seq.matcher.mask(), seq.matcher.vocab_size)
        seconds = time.perf_counter() - began
        st = self._stats
        st.grammar_mask_seconds += seconds
        st.grammar_wait_seconds += seconds
        st.grammar_masks += 1
        return mask

    def _collect_masks(
        self, seqs: list[Sequence], pending: Future[tuple[list[TokenMask], float]] | None
    ) -> dict[int, TokenMask]:
        """The masks the worker filled, by id of their request; counted."""
        if pending is None:
            return {}
        waited = time.perf_counter()
        masks, seconds = pending.result()
        st = self._stats
        st.grammar_wait_seconds += time.perf_counter() - waited if self._masks.overlap else seconds
        st.grammar_mask_seconds += seconds
        st.grammar_masks += len(seqs)
        return {id(seq): mask for seq, mask in zip(seqs, masks, strict=True)}

    def _count(self, out: SchedulerOutput) -> None:
        """The step's counters, and the time each request in it was first scheduled (mutates)."""
        now = time.perf_counter()
        for item in out.scheduled:
            if item.seq.first_scheduled_time is None:
                item.seq.first_scheduled_time = now
        st = self._stats
        st.steps += 1
        st.tokens_computed += out.num_tokens
        st.max_requests_in_step = max(st.max_requests_in_step, len(out.scheduled))
        sizes = [
            1 if s.seq.draft_token_ids else s.num_new_tokens for s in out.scheduled
        ]  # a verify is a decode
        st.mixed_steps += 1 in sizes and any(n > 1 for n in sizes)
        started = [s.seq for s in out.scheduled if s.seq.num_computed_tokens > s.seq.num_cached_tokens]
        for item in out.scheduled:
            seq = item.seq
            if seq.num_computed_tokens == seq.num_cached_tokens and not seq.output_token_ids:
                st.joins_mid_flight += any(other is not seq for other in started)
                st.chunked_prompts += item.num_new_tokens < seq.num_uncomputed

    def _append_token(self, seq: Sequence, choice: Sample | Exception, now: float) -> None:
        if isinstance(choice, Exception):
            raise choice
        seq.append_token(choice, now)
        self._stats.tokens_generated += 1
        reason = check_stop(seq, choice.token_id, self.stop_token_ids)
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish_reason = reason
        seq.status = Status.FINISHED
        seq.finish_time = time.perf_counter()
        seq.draft_token_ids = []
        self._scheduler.remove(seq)
        self._forget_drafts([seq])

    def release_finished(self, request_id: str) -> None:
        """Forget a finished request's bookkeeping (mutates)."""
        seq = self._requests.get(request_id)
        if seq is not None and seq.finished:
            del self._requests[request_id]


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
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in batch]
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


def _view(seq: Sequence) -> RequestView:
    return RequestView(
        request_id=seq.request_id,
        state=seq.status,
        priority=seq.priority,
        tenant=seq.tenant,
        num_prompt_tokens=len(seq.prompt_token_ids),
        num_output_tokens=len(seq.output_token_ids),
        num_computed_tokens=seq.num_computed_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        num_blocks=len(seq.block_table),
        num_preemptions=seq.num_preemptions,
        finish_reason=seq.finish_reason,
    )
