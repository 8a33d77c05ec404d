"""BlockPool: free counts, check-then-act, reference counts of shared prefix blocks, the hash chain,
eviction of cached-but-free blocks, exhaustion and the prefix-cache counters; and a model-based
property test over any interleaving of allocate / free / register / match / reset."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv.block_pool import BlockPool, chain_hash

MODEL = "tiny"


def _chain(blocks: list[list[int]], model_key: str = MODEL) -> list[bytes]:
    """The hash chain of consecutive full blocks, as the scheduler builds it."""
    hashes: list[bytes] = []
    parent = None
    for tokens in blocks:
        parent = chain_hash(parent, tokens, model_key)
        hashes.append(parent)
    return hashes


def _snapshot(pool: BlockPool) -> tuple:
    return (
        pool.num_free,
        pool.num_used,
        [pool.ref_count(b) for b in range(pool.num_blocks)],
        pool.queries,
        pool.hits,
    )


# ---- counts, check-then-act, exhaustion ------------------------------------------------------


def test_a_fresh_pool_is_all_free_with_zero_counters():
    pool = BlockPool(8, 4)
    assert (pool.num_free, pool.num_used, pool.usage) == (8, 0, 0.0)
    assert (pool.queries, pool.hits) == (0, 0)
    assert all(pool.ref_count(b) == 0 for b in range(8))


def test_allocate_hands_out_distinct_blocks_with_one_reference_each():
    pool = BlockPool(10, 4)
    first = pool.allocate(3)
    second = pool.allocate(4)
    assert len(set(first + second)) == 7
    assert all(0 <= b < 10 for b in first + second)
    assert all(pool.ref_count(b) == 1 for b in first + second)
    assert (pool.num_free, pool.num_used) == (3, 7)
    assert pool.usage == pytest.approx(0.7)
    assert pool.allocate(0) == []
    assert pool.num_free == 3


def test_can_allocate_only_looks_and_agrees_with_allocate():
    pool = BlockPool(5, 2)
    pool.allocate(2)
    before = _snapshot(pool)
    for count in range(0, 8):
        assert pool.can_allocate(count) == (count <= 3)
    assert _snapshot(pool) == before  # asking never mutates
    assert pool.can_allocate(3)
    assert len(pool.allocate(3)) == 3
    assert not pool.can_allocate(1)
    assert pool.can_allocate(0)


def test_allocating_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(4, 2)
    held = pool.allocate(3)
    before = _snapshot(pool)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate(2)
    assert _snapshot(pool) == before  # refused whole: no block was taken on the way
    assert len(pool.allocate(1)) == 1
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    pool.free(held)
    assert pool.num_free == 3


def test_free_returns_blocks_and_a_second_free_raises():
    pool = BlockPool(4, 2)
    blocks = pool.allocate(2)
    pool.free(blocks)
    assert (pool.num_free, pool.num_used) == (4, 0)
    assert all(pool.ref_count(b) == 0 for b in blocks)
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free([blocks[0]])
    assert pool.num_free == 4


def test_freed_blocks_are_reused_least_recently_freed_first_tail_first():
    pool = BlockPool(6, 2)
    a = pool.allocate(3)
    b = pool.allocate(3)
    pool.free(a)  # joins the back tail first: a[2], a[1], a[0]
    pool.free(b)
    assert pool.allocate(6) == [a[2], a[1], a[0], b[2], b[1], b[0]]


# ---- prefix caching: sharing, reference counts, counters ---------------------------------------


def test_a_matched_prefix_is_shared_and_reference_counted():
    pool = BlockPool(8, 2)
    hashes = _chain([[1, 2], [3, 4], [5, 6]])
    a = pool.allocate(3)
    for block, h in zip(a[:2], hashes[:2], strict=True):  # only two of its blocks are full and computed
        pool.register(block, h)
    used = pool.num_used

    shared = pool.match_prefix(hashes)
    assert shared == a[:2]
    assert [pool.ref_count(x) for x in a] == [2, 2, 1]
    assert pool.num_used == used  # sharing takes no new block
    assert (pool.queries, pool.hits) == (3, 2)

    pool.free(a)  # the owner leaves: shared blocks stay with the second holder
    assert [pool.ref_count(x) for x in a] == [1, 1, 0]
    assert pool.num_free == 8 - 2
    pool.free(shared)
    assert pool.num_free == 8 and pool.num_used == 0

    # unreferenced but still cached: a later request hits them and takes them off the free queue
    again = pool.match_prefix(hashes[:2])
    assert again == a[:2]
    assert [pool.ref_count(x) for x in again] == [1, 1]
    assert pool.num_free == 6
    assert (pool.queries, pool.hits) == (5, 4)
    rest = pool.allocate(6)  # everything else: the matched blocks are not handed out again
    assert not set(rest) & set(again)
    assert not pool.can_allocate(1)


def test_match_stops_at_the_first_miss_and_counts_every_block_asked_for():
    pool = BlockPool(6, 2)
    hashes = _chain([[1, 1], [2, 2], [3, 3]])
    blocks = pool.allocate(3)
    pool.register(blocks[0], hashes[0])
    pool.register(blocks[2], hashes[2])  # the third is cached but the second is not: no jump over a hole
    assert pool.match_prefix(hashes) == [blocks[0]]
    assert (pool.queries, pool.hits) == (3, 1)
    assert pool.match_prefix([]) == []
    assert (pool.queries, pool.hits) == (3, 1)
    assert pool.match_prefix(_chain([[9, 9]])) == []
    assert (pool.queries, pool.hits) == (4, 1)


def test_register_keeps_the_first_entry_for_a_hash_and_the_first_hash_of_a_block():
    pool = BlockPool(4, 2)
    h1, h2 = _chain([[1, 2], [3, 4]])
    b0, b1 = pool.allocate(2)
    pool.register(b0, h1)
    pool.register(b1, h1)  # a duplicate computed by another request: the existing entry wins
    pool.register(b0, h2)  # the block already has a hash: ignored
    assert pool.match_prefix([h1]) == [b0]
    assert pool.match_prefix([h2]) == []


def test_cached_free_blocks_are_evicted_when_the_pool_runs_dry():
    pool = BlockPool(4, 2)
    hashes = _chain([[1, 2], [3, 4], [5, 6], [7, 8]])
    blocks = pool.allocate(4)
    for block, h in zip(blocks, hashes, strict=True):
        pool.register(block, h)
    pool.free(blocks)
    assert pool.num_free == 4  # cached blocks count as free
    assert pool.can_allocate(4)
    taken = pool.allocate(1)  # evicts the least recently freed: the chain's tail
    assert taken == [blocks[3]]
    assert pool.match_prefix(hashes) == blocks[:3]  # the head survives; the evicted block's hash is gone
    pool.free(blocks[:3])
    evicted = pool.allocate(3)
    assert sorted(evicted) == sorted(blocks[:3])
    assert pool.match_prefix(hashes) == []  # a reused block loses its hash
    pool.free(evicted + taken)
    assert pool.match_prefix(hashes) == []


def test_a_reused_block_can_be_registered_again_under_a_new_hash():
    pool = BlockPool(1, 2)
    old, new = _chain([[1, 2]]), _chain([[3, 4]])
    (block,) = pool.allocate(1)
    pool.register(block, old[0])
    pool.free([block])
    assert pool.allocate(1) == [block]
    pool.register(block, new[0])
    assert pool.match_prefix(old) == []
    assert pool.match_prefix(new) == [block]
    assert pool.ref_count(block) == 2


def test_reset_prefix_cache_forgets_hashes_but_keeps_references():
    pool = BlockPool(4, 2)
    hashes = _chain([[1, 2], [3, 4]])
    blocks = pool.allocate(2)
    for block, h in zip(blocks, hashes, strict=True):
        pool.register(block, h)
    shared = pool.match_prefix(hashes)
    queries, hits = pool.queries, pool.hits
    pool.reset_prefix_cache()
    assert [pool.ref_count(b) for b in blocks] == [2, 2]
    assert pool.num_used == 2
    assert pool.match_prefix(hashes) == []
    assert (pool.queries, pool.hits) == (queries + 2, hits)  # counters are not reset
    pool.free(shared)
    pool.free(blocks)
    assert pool.num_free == 4
    assert pool.match_prefix(hashes) == []
    # registering again after a reset works, for the same block or another
    other = pool.allocate(1)
    pool.register(other[0], hashes[0])
    assert pool.match_prefix(hashes) == other


def test_the_pool_uses_its_hash_function_for_the_scheduler():
    calls = []

    def flat(parent, tokens, model_key):
        calls.append((parent, tuple(tokens), model_key))
        return chain_hash(None, tokens, model_key)

    pool = BlockPool(2, 2, hash_fn=flat)
    assert pool.hash_fn is flat
    pool.hash_fn(None, [1, 2], MODEL)
    assert calls == [(None, (1, 2), MODEL)]


# ---- the hash chain --------------------------------------------------------------------------


def test_a_block_hash_is_deterministic_and_fixed_size():
    assert chain_hash(None, [1, 2, 3], MODEL) == chain_hash(None, (1, 2, 3), MODEL)
    assert len(chain_hash(None, [1, 2, 3], MODEL)) == 16
    assert chain_hash(None, [0, 2**32 - 1], MODEL) != chain_hash(None, [0, 2**32 - 2], MODEL)


def test_a_block_hash_depends_on_its_tokens_and_their_order():
    assert chain_hash(None, [1, 2], MODEL) != chain_hash(None, [2, 1], MODEL)
    assert chain_hash(None, [1, 0], MODEL) != chain_hash(None, [256], MODEL)
    assert chain_hash(None, [1, 2], MODEL) != chain_hash(None, [1, 2, 0], MODEL)


def test_same_tokens_under_another_parent_or_position_hash_differently():
    a = _chain([[1, 2], [3, 4], [5, 6]])
    b = _chain([[9, 9], [3, 4], [5, 6]])  # same second and third blocks, another first block
    c = _chain([[3, 4], [1, 2], [5, 6]])  # [3, 4] at another position
    assert a[0] != b[0]
    assert a[1] != b[1] and a[2] != b[2]  # a difference anywhere upstream reaches every descendant
    assert a[1] != c[0]  # the same tokens at position 0 and at position 1
    assert a[2] != c[2]
    assert len(set(a + b + c)) == 9


def test_the_model_key_separates_every_block_of_a_chain():
    blocks = [[1, 2], [3, 4], [5, 6]]
    tiny, other = _chain(blocks, "tiny"), _chain(blocks, "smollm2")
    assert not set(tiny) & set(other)
    assert _chain(blocks, "tiny") == tiny


def test_a_prompt_prefix_hits_only_for_the_same_model_and_the_same_prefix():
    pool = BlockPool(8, 2)
    prompt = [[1, 2], [3, 4], [5, 6]]
    mine = _chain(prompt)
    blocks = pool.allocate(3)
    for block, h in zip(blocks, mine, strict=True):
        pool.register(block, h)
    assert pool.match_prefix(_chain(prompt, "another-model")) == []
    assert pool.match_prefix(_chain([[1, 2], [3, 4], [7, 7]])) == blocks[:2]
    assert pool.match_prefix(_chain([[0, 0], [3, 4], [5, 6]])) == []


# ---- the property: any interleaving keeps the books -------------------------------------------

LABELS = [bytes([i]) * 16 for i in range(6)]  # stand-in hashes: the pool treats them as opaque keys


class PoolMachine(RuleBasedStateMachine):
    """Drives a BlockPool and a plain model of it (reference counts, hash index, counters) side by side."""

    def __init__(self):
        super().__init__()
        self.size = 3
        self.pool = BlockPool(self.size, 4)
        self.refs = [0] * self.size
        self.tables: list[list[int]] = []  # what each holder holds (allocated or matched)
        self.block_of: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}
        self.queries = 0
        self.hits = 0

    @rule(count=st.integers(0, 4), label=st.none() | st.sampled_from(LABELS))
    def allocate(self, count, label):
        free = self.refs.count(0)
        assert self.pool.can_allocate(count) == (count <= free)
        if count > free:
            with pytest.raises(RuntimeError):
                self.pool.allocate(count)
            return
        blocks = self.pool.allocate(count)
        assert len(blocks) == count and len(set(blocks)) == count
        for block in blocks:
            assert self.refs[block] == 0, f"block {block} handed out while held"
            self.refs[block] = 1
            h = self.hash_of.pop(block, None)  # a reused block loses its hash
            if h is not None:
                del self.block_of[h]
        self.tables.append(blocks)
        if blocks and label is not None:  # computed at once: index its first block
            self._register(blocks[0], label)

    def _register(self, block, label):
        self.pool.register(block, label)
        if label not in self.block_of and block not in self.hash_of:
            self.block_of[label] = block
            self.hash_of[block] = label

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free(self, data):
        table = self.tables.pop(data.draw(st.integers(0, len(self.tables) - 1)))
        self.pool.free(table)
        for block in table:
            self.refs[block] -= 1

    @precondition(lambda self: any(self.tables))
    @rule(data=st.data(), label=st.sampled_from(LABELS))
    def register(self, data, label):
        table = data.draw(st.sampled_from([t for t in self.tables if t]))
        self._register(data.draw(st.sampled_from(table)), label)

    @rule(labels=st.lists(st.sampled_from(LABELS), max_size=4))
    def match(self, labels):
        expected = []
        for label in labels:
            if label not in self.block_of:
                break
            expected.append(self.block_of[label])
        found = self.pool.match_prefix(labels)
        assert found == expected
        self.queries += len(labels)
        self.hits += len(found)
        for block in found:
            self.refs[block] += 1
        self.tables.append(found)

    @rule()
    def reset(self):
        self.pool.reset_prefix_cache()
        self.block_of.clear()
        self.hash_of.clear()

    @precondition(lambda self: 0 in self.refs)
    @rule(data=st.data())
    def free_an_unheld_block(self, data):
        block = data.draw(st.sampled_from([b for b in range(self.size) if self.refs[b] == 0]))
        with pytest.raises(RuntimeError):
            self.pool.free([block])

    @invariant()
    def books_balance(self):
        pool = self.pool
        assert pool.num_free + pool.num_used == pool.num_blocks
        assert pool.num_free == self.refs.count(0)
        assert [pool.ref_count(b) for b in range(self.size)] == self.refs
        held = sum(len(t) for t in self.tables)
        assert held == sum(self.refs)
        assert pool.usage == pytest.approx(pool.num_used / pool.num_blocks)
        assert (pool.queries, pool.hits) == (self.queries, self.hits)

    @invariant()
    def the_hash_index_agrees(self):
        """Probe every label without disturbing the free queue: a label the model does not index must
        miss (a reused block lost its hash); a label of a held block must hit it (then let go again)."""
        for label in LABELS:
            block = self.block_of.get(label)
            if block is not None and self.refs[block] == 0:
                continue  # a hit would take the block off the free queue and change the eviction order
            found = self.pool.match_prefix([label])
            self.queries += 1
            if block is None:
                assert found == [], f"stale hash {label[:1]!r} -> {found}"
            else:
                assert found == [block]
                self.hits += 1
                self.pool.free(found)


PoolMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
test_any_interleaving_keeps_the_books = PoolMachine.TestCase
