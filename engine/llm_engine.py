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

import torch

from engine.config import EngineConfig, resolve_device
from engine.errors import CapacityError, InvalidRequestError
from engine.kv.block_pool import BlockPool
from engine.kv.cache import KVCache
from engine.layers.sampler import Sample, SampleRequest, sample_batch
from engine.loader import ChatTokenizer, IncrementalDetokenizer, LoadedModel
from engine.model_config import ModelConfig
from engine.model_runner import ModelRunner
from engine.models.llama import Faults, PagedLlama
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput, VerifyRows
from engine.sequence import Sequence
from engine.snapshot import EngineCounters, EngineSnapshot, RequestView
from engine.speculative.proposers import make_proposer
from engine.speculative.speculator import Speculator
from engine.speculative.verifier import Verify, VerifyFaults, verify_run, verify_run_with_faults
from engine.structured import GrammarCompiler, GrammarMatcher, MaskWorker, TokenMask

# runs a step's forward and draws its tokens: Engine._execute, or under a fault hook a wrapper
Execute = Callable[[SchedulerOutput], ModelRunnerOutput]


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
        self.stop_token_ids = frozenset(loaded.tokenizer.stop_token_ids)
        self._scheduler = Scheduler(
            config,
            self._pool,
            model_key,
            context_keyed=self._model.splits_context_rows,
            stop_token_ids=self.stop_token_ids,
        )
        self._runner = ModelRunner(self._model, self._kv)
        self._requests: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._stats = EngineCounters()  # this engine's own, mutated each step; callers get copies
        self.grammars = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
        self._masks = MaskWorker()
        self._speculator = Speculator(config.spec, make_proposer(config.spec, loaded, config), self._stats)
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
        self._scheduler.finish(seq, "abort")
        self._speculator.forget([seq])
        return seq.output()

    def has_unfinished(self) -> bool:
        return self._scheduler.has_unfinished()

    @property
    def counters(self) -> EngineCounters:
        """A copy of the engine's life counters (steps, tokens, preemptions, ...)."""
        sched = self._scheduler
        return dataclasses.replace(
            self._stats, preemptions=sched.num_preemptions, tokens_generated=sched.num_generated_tokens
        )

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

    def fault_in_kv_pool(self) -> None:
        """Make the whole KV pool resident now (contents unchanged). On the CPU the pool's pages join the
        process as requests first write them (engine/kv/cache.py); a caller that wants the full cost up
        front, as the bench's memory probe measures it, calls this."""
        self._kv.fault_in()

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
        """Run one batched forward over the scheduled requests; return the outputs of those that
        advanced (mutates)."""
        # A step, as in vLLM v1: propose -> schedule -> execute -> update_from_output.
        # 1. propose: the speculator drafts tokens for the running requests about to decode (within
        #    each one's back-off; none while the batch is large, or with speculation off).
        # 2. schedule: the scheduler picks who runs with how many tokens (decodes, verifies of 1 + k
        #    rows, prefill chunks, admissions), growing block tables and preempting by recompute to
        #    make room (SchedulerOutput); the speculator forgets the preempted.
        # 3. execute: one batched forward; one batched draw for the rows that end a request's tokens,
        #    and for each speculating request a verifier over its rows (ModelRunnerOutput).
        # 4. update_from_output: the scheduler counts computed tokens (prefix cache, tenant charge),
        #    appends each draw, walks each verifier row by row, checks stops, finishes requests and
        #    frees their blocks (StepUpdate); the speculator settles its drafts' state.
        # 5. one RequestOutput per request that drew a token or finished.
        # Fault hooks (engine/testing.py) are looked at once per step, here; while one is on the step
        # takes the slow path (_step_under_faults), which wraps execute and the verifier.
        if self._faults.active or self._verify_faults is not None:  # a step's one look at the fault hooks
            return self._step_under_faults()
        return self._step(self._execute)

    def _step(self, execute: Execute) -> list[RequestOutput]:
        """``step()`` itself, as its comment says; ``execute`` runs the forward and draws (``_execute``,
        or its wrapper under a fault hook)."""
        self._speculator.propose(self._scheduler.running)
        out = self._scheduler.schedule()
        self._speculator.forget(out.preempted)
        if not out.scheduled:
            return []
        self._count(out)
        output = execute(out)  # the forward and its draws
        update = self._scheduler.update_from_output(out, output)
        self._speculator.settle(update)
        return [seq.output() for seq in update.advanced]

    def _step_under_faults(self) -> list[RequestOutput]:
        """``step()`` with the switched-on hooks of engine/testing.py applied (the slow path, taken only
        while one is on): named requests fail when they sample, constrained requests run as if they had no
        grammar (their matchers set aside for the step), the verifier runs with its deliberate bugs."""
        faults, verify_faults = self._faults, self._verify_faults
        walk: Verify = verify_run
        if verify_faults is not None:
            walk = functools.partial(verify_run_with_faults, faults=verify_faults)
        failing = frozenset(faults.fail_requests)

        def execute(out: SchedulerOutput) -> ModelRunnerOutput:
            return _fail_named(self._execute(out, walk), out, failing)

        unmasked = (
            [s for s in self._requests.values() if s.matcher is not None] if faults.grammar_mask_off else []
        )
        matchers = [s.matcher for s in unmasked]
        for seq in unmasked:
            seq.matcher = None
        try:
            return self._step(execute)
        finally:
            for seq, matcher in zip(unmasked, matchers, strict=True):
                seq.matcher = matcher

    def _execute(self, out: SchedulerOutput, walk: Verify = verify_run) -> ModelRunnerOutput:
        """Run the step's forward and draw: one batched sampling call for the requests whose rows end
        their tokens; a speculating request gets ``walk`` over its rows instead, drawn as the scheduler
        updates it (mutates the drawing requests' generators and the grammar counters)."""
        # the grammar masks of the requests about to sample: filled during the forward when a core is
        # spare, else now (engine/structured/masks.py)
        constrained = self._constrained_samplers(out)
        pending = self._masks.start([matcher for _, matcher in constrained])
        logits, rows = self._runner.run(out)  # logits: [rows sampled, vocab]; rows: per scheduled request
        masks = self._collect_masks([seq for seq, _ in constrained], pending)
        now = time.perf_counter()
        drawing: list[tuple[int, Sequence, int]] = []  # (index in the step, request, its logits row)
        verifiers: dict[str, VerifyRows] = {}
        for i, (item, row) in enumerate(zip(out.scheduled, rows, strict=True)):
            if row is not None and item.seq.draft_token_ids:
                verifiers[item.seq.request_id] = self._verifier(item.seq, logits, row, walk)
            elif row is not None:
                drawing.append((i, item.seq, row))
        requests = [
            SampleRequest(s.params, s.generator, s.prompt_token_ids, s.output_token_ids, masks.get(id(s)))
            for _, s, _ in drawing
        ]
        picked = [row for _, _, row in drawing]  # one batched sampling call for the step's drawn rows
        sampled: list[Sample | Exception | None] = [None] * len(rows)
        for (i, _, _), choice in zip(drawing, sample_batch(logits[picked], requests), strict=True):
            sampled[i] = choice
        return ModelRunnerOutput(sampled, verifiers, now)

    def _verifier(self, seq: Sequence, logits: torch.Tensor, row: int, walk: Verify) -> VerifyRows:
        """A speculating request's verification (Speculator.verify) bound to this step's logits: rows
        ``row - k .. row`` follow its last token and its k proposals."""
        first = row - len(seq.draft_token_ids)

        def draw(i: int) -> Sample:
            request = SampleRequest(
                seq.params, seq.generator, seq.prompt_token_ids, seq.output_token_ids, self._row_mask(seq)
            )
            choice = sample_batch(logits[first + i : first + i + 1], [request])[0]  # [1, vocab]
            if isinstance(choice, Exception):
                raise choice
            return choice

        return functools.partial(self._speculator.verify, seq, draw, walk)

    def _constrained_samplers(self, out: SchedulerOutput) -> list[tuple[Sequence, GrammarMatcher]]:
        """The step's requests that have a grammar and sample one token at its end (a verifying
        request's rows are masked one at a time, in ``_verifier``)."""
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
        """Count the step in the engine's counters (mutates them; reads the requests)."""
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

    def release_finished(self, request_id: str) -> None:
        """Forget a finished request's bookkeeping (mutates)."""
        seq = self._requests.get(request_id)
        if seq is not None and seq.finished:
            del self._requests[request_id]


def _fail_named(output: ModelRunnerOutput, out: SchedulerOutput, names: frozenset[str]) -> ModelRunnerOutput:
    """``output`` with the named requests failing as they sample (the ``fail_requests`` hook): a token
    drawn becomes an error, a verifier raises at its first emitted token."""
    if not names:
        return output
    sampled = [
        RuntimeError("injected failure") if drawn is not None and item.seq.request_id in names else drawn
        for item, drawn in zip(out.scheduled, output.sampled, strict=True)
    ]
    verifiers = {rid: _failing(v) if rid in names else v for rid, v in output.verifiers.items()}
    return dataclasses.replace(output, sampled=sampled, verifiers=verifiers)


def _failing(verify: VerifyRows) -> VerifyRows:
    """``verify`` whose first emitted token raises (after its draw, as a failing append would)."""

    def emit_fails(choice: Sample) -> bool:
        raise RuntimeError("injected failure")

    return lambda reached, emit: verify(reached, emit_fails)


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
