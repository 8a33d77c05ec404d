"""A draft model proposes: a second, smaller model with the target's tokenizer, its own paged KV cache.

Each step the draft catches up on the request's tokens it has not seen (its whole prompt the first
time, then the tokens the verifier kept), then decodes n tokens one forward at a time, batched across
the speculating requests. It samples with the request's own parameters and a clone of the request's
generator (the same noise the target will draw with), so a draft close to the target proposes what the
target will draw. After verification it keeps the K/V of the positions whose tokens the target kept.

``layers:N`` as the draft model: the target's own first N layers with its final norm and LM head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig, resolve_device
from engine.errors import InvalidRequestError, NxError
from engine.kv.block_pool import BlockPool
from engine.kv.cache import KVCache
from engine.layers.sampler import sample
from engine.loader import LoadedModel, load_model
from engine.model_runner import RowSpan, lay_out
from engine.models.llama import Faults, PagedLlama
from engine.sequence import Sequence
from engine.settings import SpecConfig

CATCH_UP_CHUNK = 512  # most rows of one request's catch-up in one draft forward
SELF_DRAFT = "layers:"


@dataclass
class DraftState:
    """The draft's view of one request: its blocks and how many of the request's tokens it has computed."""

    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0


def first_layers(target: LoadedModel, count: int) -> LoadedModel:
    """The target's first ``count`` layers, final norm and LM head as a model of their own."""
    if not 1 <= count < target.config.num_layers:
        raise InvalidRequestError(
            f"draft model {SELF_DRAFT}{count}: the target has {target.config.num_layers} layers; "
            f"choose N in [1, {target.config.num_layers - 1}]"
        )
    kept = {
        name: w
        for name, w in target.weights.items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < count
    }
    config = dataclasses.replace(
        target.config,
        num_layers=count,
        quantized_weights=tuple((n, t) for n, t in target.config.quantized_weights if n in kept),
        half_weights=tuple((n, t) for n, t in target.config.half_weights if n in kept),
    )
    return LoadedModel(target.source, config, kept, target.tokenizer)


def load_draft(name: str, target: LoadedModel) -> LoadedModel:
    """The draft model ``name`` (checked to share the target's vocabulary); one-line errors."""
    if name.startswith(SELF_DRAFT):
        count = name.removeprefix(SELF_DRAFT)
        if not count.isdigit():
            raise InvalidRequestError(f"draft model {name!r}: write {SELF_DRAFT}N with N a number of layers")
        return first_layers(target, int(count))
    try:
        draft = load_model(name)
    except NxError as exc:
        raise type(exc)(f"draft model {name!r} cannot be loaded: {exc}") from None
    if draft.config.vocab_size != target.config.vocab_size:
        raise InvalidRequestError(
            f"draft model {name!r} has a vocabulary of {draft.config.vocab_size} tokens; "
            f"the target's has {target.config.vocab_size}: they must share one tokenizer"
        )
    theirs = draft.tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    if theirs != target.tokenizer.tokenizer.get_vocab(with_added_tokens=True):
        raise InvalidRequestError(
            f"draft model {name!r} has another tokenizer than the target: they must share one"
        )
    return draft


class DraftProposer:
    """Proposes with a draft model over a KV pool of its own (as many blocks as the target's)."""

    def __init__(self, spec: SpecConfig, target: LoadedModel, config: EngineConfig):
        assert spec.draft_model is not None
        draft = load_draft(spec.draft_model, target)
        self.device = resolve_device(config.device)
        self.model = PagedLlama(
            draft.config,
            draft.weights,
            config.torch_dtype,
            self.device,
            config.batch_invariant,
            Faults(),
            config.quantize,
            config.activations,
        )
        self.kv = KVCache(
            draft.config,
            config.num_kv_blocks,
            config.block_size,
            config.kv_dtype(self.model.holds_quantized),
            self.device,
        )
        self.pool = BlockPool(config.num_kv_blocks, config.block_size)
        self.block_size = config.block_size
        self.states: dict[str, DraftState] = {}

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes + self.kv.bytes

    def propose(self, wanted: list[tuple[Sequence, int]]) -> list[list[int]]:
        """Each request's catch-up, then up to n draft tokens each, one batched forward per position."""
        proposals: dict[int, list[int]] = {id(seq): [] for seq, _ in wanted}
        active = [(seq, n) for seq, n in wanted if self._reserve(seq, seq.num_tokens - 1 + n)]
        generators = {id(seq): _clone(seq.generator) for seq, _ in active}
        self._catch_up([seq for seq, _ in active])
        spans = [
            self._span(seq, seq.all_token_ids[self.states[seq.request_id].num_computed :])
            for seq, _ in active
        ]
        for step in range(max((n for _, n in active), default=0)):
            logits = self._forward(spans)  # [len(active), vocab]
            for row, (seq, _) in enumerate(active):
                drafted = proposals[id(seq)]
                choice = sample(
                    logits[row],
                    seq.params,
                    generators[id(seq)],
                    seq.prompt_token_ids,
                    seq.output_token_ids + drafted,
                )
                drafted.append(choice.token_id)
                self.states[seq.request_id].num_computed += len(spans[row].tokens)
            active = [(seq, n) for seq, n in active if n > step + 1]
            spans = [self._span(seq, [proposals[id(seq)][-1]]) for seq, _ in active]
        return [proposals[id(seq)] for seq, _ in wanted]

    def verified(self, seq: Sequence) -> None:
        """Keep the draft's K/V of the positions whose tokens the target kept; give back blocks past them."""
        state = self.states.get(seq.request_id)
        if state is None:
            return
        state.num_computed = min(state.num_computed, seq.num_computed_tokens)
        keep = -(-seq.num_tokens // self.block_size)
        if len(state.block_table) > keep:
            self.pool.free(state.block_table[keep:])
            del state.block_table[keep:]

    def forget(self, seq: Sequence) -> None:
        state = self.states.pop(seq.request_id, None)
        if state is not None and state.block_table:
            self.pool.free(state.block_table)

    def _reserve(self, seq: Sequence, last_position: int) -> bool:
        """Blocks for the draft's rows up to ``last_position``; False (and the request's draft state
        dropped) when the draft pool is short: it then decodes without proposals this step."""
        state = self.states.setdefault(seq.request_id, DraftState())
        need = max(0, -(-(last_position + 1) // self.block_size) - len(state.block_table))
        if not self.pool.can_allocate(need):
            self.forget(seq)
            return False
        state.block_table.extend(self.pool.allocate(need))
        return True

    def _catch_up(self, seqs: list[Sequence]) -> None:
        """Forward each request's unseen tokens but the last, CATCH_UP_CHUNK rows at a time."""
        while True:
            spans, owners = [], []
            for seq in seqs:
                state = self.states[seq.request_id]
                end = min(seq.num_tokens - 1, state.num_computed + CATCH_UP_CHUNK)
                if end > state.num_computed:
                    spans.append(
                        RowSpan(
                            seq.all_token_ids[state.num_computed : end],
                            state.num_computed,
                            state.block_table,
                            0,
                        )
                    )
                    owners.append(state)
            if not spans:
                return
            batch, _ = lay_out(spans, self.block_size, self.device)
            self.model.forward(batch, self.kv)
            for span, state in zip(spans, owners, strict=True):
                state.num_computed += len(span.tokens)

    def _span(self, seq: Sequence, tokens: list[int]) -> RowSpan:
        state = self.states[seq.request_id]
        return RowSpan(tokens, state.num_computed, state.block_table, 1)

    def _forward(self, spans: list[RowSpan]) -> torch.Tensor:
        """Logits of each span's last row: [len(spans), vocab] float32 on the CPU."""
        batch, last = lay_out(spans, self.block_size, self.device)
        logits = self.model.forward(batch, self.kv).cpu()
        return logits[torch.tensor(last, dtype=torch.long)]


def _clone(generator: torch.Generator) -> torch.Generator:
    """A generator in the same state: it draws the same noise without advancing the original."""
    twin = torch.Generator(device=generator.device)
    twin.set_state(generator.get_state())
    return twin
