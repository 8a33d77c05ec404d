"""Block accounting for the paged KV cache (the tensors live in kv/cache.py).

The pool hands out fixed-size blocks of ``block_size`` token slots. A request holds a block table
(its blocks in token order). Full blocks may be registered under a hash chain of their tokens
(prefix caching): a later request whose prompt starts with the same tokens reuses them, reference
counted. A block whose count drops to zero goes to the back of the free queue but keeps its hash, so
it can still be hit until it is handed out again (least recently freed blocks are reused first).

    free queue (front = reused first):  [ b4  b9(h=ab12)  b1(h=77c0)  b3 ... ]
    hash -> block:                      { ab12: b9, 77c0: b1, ... }
    ref counts:                         b2: 2 (shared prefix), b5: 1, ...
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

BlockHash = bytes
# (parent hash or None, the block's token ids, a key naming the model) -> the block's hash
HashFn = Callable[[BlockHash | None, Sequence[int], str], BlockHash]


def chain_hash(parent: BlockHash | None, tokens: Sequence[int], model_key: str) -> BlockHash:
    """The block's key: a hash of its parent block's key, its own tokens, and ``model_key`` (the model,
    and whatever else decides how this block's K/V were computed: hashed for every block)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"")
    h.update(model_key.encode())
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
    return h.digest()


class BlockPool:
    """Free list, reference counts and the prefix-hash index of ``num_blocks`` blocks. Not thread-safe."""

    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn = chain_hash):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_fn = hash_fn
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}
        self.queries = 0  # prefix-cache lookups (blocks asked for)
        self.hits = 0  # blocks found

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def can_allocate(self, count: int) -> bool:
        """Whether ``count`` blocks can be handed out now (does not mutate)."""
        return count <= len(self._free)

    def allocate(self, count: int) -> list[int]:
        """Hand out ``count`` blocks (mutates); a reused cached block loses its hash. Raises if short."""
        if count > len(self._free):
            raise RuntimeError(f"KV pool exhausted: {count} blocks asked, {len(self._free)} free")
        blocks = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            self._forget(block)
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block (mutates); unreferenced blocks join the back of the free queue."""
        for block in reversed(blocks):  # tail blocks first: a prefix's head stays cached longest
            if self._refs[block] <= 0:
                raise RuntimeError(f"block {block} freed twice")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None

    def match_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Take a reference on the longest run of cached blocks matching ``hashes`` (mutates)."""
        self.queries += len(hashes)
        found: list[int] = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        for block in found:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        self.hits += len(found)
        return found

    def register(self, block: int, block_hash: BlockHash) -> None:
        """Index a full, computed block under its hash (mutates); an existing entry for the hash wins."""
        if block_hash in self._block_of or block in self._hash_of:
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (mutates)."""
        self._hash_of.clear()
        self._block_of.clear()

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None and self._block_of.get(h) == block:
            del self._block_of[h]
