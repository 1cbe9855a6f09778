"""The block pool: which physical KV blocks are free, who holds each one, and which hold a known prefix.

The pool hands out block ids; it owns no tensors (paged_cache.py holds the keys and values). Each block
has a reference count: the number of running requests whose block table lists it. With prefix
caching, a full block is also filed under a hash of its tokens *chained to its parent block's hash*,

    hash(block i) = sha256(hash(block i-1) || token ids of block i)

so one hash names the whole prefix up to and including that block, and two requests whose prompts
start with the same tokens get the same hashes for those blocks. A block whose count drops to zero
keeps its contents and its hash: it goes to the back of the free queue, and a later request with the
same prefix can take it back (a cache hit) until it reaches the front of the queue and is handed out
for new tokens (evicted, least recently used first).

    pool = BlockPool(num_blocks=64)
    table = pool.allocate(3)              # three free block ids, each with count 1
    pool.release(table)                   # counts back to 0; the blocks are free again
    pool.num_free == 64

Out of scope (vLLM has them): copy-on-write forking of a block shared by two sequences (beam search,
parallel sampling), swapping blocks to CPU memory, multiple KV cache groups (sliding-window and full
layers with different block tables), and hash salts per tenant (cache isolation).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

ROOT_HASH = b""  # the parent of a request's first block


def block_hash(parent: bytes, token_ids) -> bytes:
    """The chained hash of one full block: its parent's hash and its own token ids."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def prefix_hashes(token_ids, block_size: int) -> list[bytes]:
    """Chained hashes of every *full* block of `token_ids` (a partly filled last block gets none)."""
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class BlockPool:
    """Free list, reference counts and the prefix-cache index for `num_blocks` blocks."""

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = False):
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1; got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # chained hash -> block id holding that prefix block
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # LRU first
        self.hits = self.queries = self.evictions = 0  # counted in blocks

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free ones, including cached blocks nobody holds)."""
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def allocate(self, n: int) -> list[int]:
        """n blocks for new tokens, each with reference count 1. Raises if fewer than n are free (the
        scheduler checks `num_free` first, so this is a bug guard, not flow control)."""
        if n > len(self.free_queue):
            raise RuntimeError(f"asked for {n} blocks with {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)  # least recently freed first
            if self.hash_of[b] is not None:  # evict: its old prefix can no longer be hit
                del self.cached[self.hash_of[b]]
                self.hash_of[b] = None
                self.evictions += 1
            self.ref_count[b] = 1
            out.append(b)
        return out

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks for the longest prefix of `hashes` found, each now held once more."""
        if not self.enable_prefix_caching:
            return []
        found = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            found.append(b)
        self.queries += len(hashes)
        self.hits += len(found)
        for b in found:
            if self.ref_count[b] == 0:
                del self.free_queue[b]
            self.ref_count[b] += 1
        return found

    def register(self, block: int, h: bytes) -> None:
        """File a block that has just become full under its chained hash (first one wins)."""
        if not self.enable_prefix_caching or self.hash_of[block] is not None:
            return
        if h not in self.cached:
            self.cached[h] = block
            self.hash_of[block] = h

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block. Freed in reverse, so a request's last blocks (the least
        likely to be shared) are evicted before its first ones."""
        for b in reversed(blocks):
            if self.ref_count[b] <= 0:
                raise RuntimeError(f"block {b} released more often than it was taken")
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free_queue[b] = None  # to the back: most recently used

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        for b in range(self.num_blocks):
            self.hash_of[b] = None
        self.cached.clear()
