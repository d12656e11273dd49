"""PyTorch's CUDA caching allocator, replayed over a sequence of allocations and frees.

The rules are those of c10/cuda/CUDACachingAllocator.cpp with its defaults (no
``max_split_size_mb``, no ``expandable_segments``, no ``roundup_power2_divisions``):

- a request is rounded up to a multiple of 512 bytes (``round_size``, kMinBlockSize);
- requests up to 1 MiB (kSmallSize) come from the small pool, larger ones from the large pool;
  each pool is per stream: a block freed on one stream is reused only by that stream;
- a request takes the smallest cached free block of its pool and stream that holds it, the
  lowest address among equals (``get_free_block``: ``pool.blocks.lower_bound``);
- a block larger than the request is split if the rest is at least 512 bytes (small pool) or
  more than 1 MiB (large pool; ``should_split``), else the request holds the whole block;
- with no such block a segment comes from cudaMalloc, sized by ``get_allocation_size``: 2 MiB
  for a small request (kSmallBuffer), 20 MiB for 1-10 MiB (kLargeBuffer), else the request
  rounded up to 2 MiB (kRoundLarge);
- a freed block merges with free neighbours of its segment (``free_block``,
  ``try_merge_blocks``) and stays cached: ``reserved`` is the segments' sum and never falls;
- when cudaMalloc would exceed the card, the allocator frees every cached segment that holds no
  allocated block and retries (``release_cached_blocks`` in ``malloc``).

``reset_peak`` is ``torch.cuda.reset_peak_memory_stats``: the peaks restart from the current
figures, so what a loop reports after it keeps whatever its set-up left cached.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512  # kMinBlockSize: every size is rounded to it
SMALL_SIZE = 1 << 20  # kSmallSize: the largest small-pool request
SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: the segment of a 1-10 MiB request
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to it


def round_size(size: int) -> int:
    """``round_size``: a request rounded up to a multiple of 512 bytes."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """``get_allocation_size``: the cudaMalloc a rounded request makes when nothing fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    stream: str
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[str, bool, int, int, int]:
        return (self.stream, self.small, self.size, self.segment, self.offset)


@dataclass
class CachingAllocator:
    """One device's allocator: ``malloc`` returns a handle ``free`` takes back."""

    capacity: float = float("inf")  # bytes cudaMalloc may take in all
    reserved: int = 0  # the segments' sum (torch.cuda.memory_reserved)
    allocated: int = 0  # the blocks handed out (torch.cuda.memory_allocated)
    peak_reserved: int = 0
    peak_allocated: int = 0
    _free: list[tuple[str, bool, int, int, int]] = field(default_factory=list)
    _blocks: dict[tuple[str, bool, int, int, int], _Block] = field(default_factory=dict)
    _segments: dict[int, tuple[int, str]] = field(default_factory=dict)  # id -> size, stream
    _whole: dict[int, tuple[str, bool, int, int, int]] = field(default_factory=dict)  # free
    _handles: dict[int, _Block] = field(default_factory=dict)
    _next_id: int = 0

    def malloc(self, size: int, stream: str = "default") -> int:
        """Allocate ``size`` bytes on ``stream``; returns a handle for ``free``."""
        size = round_size(size)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, stream, small) or self._new_segment(size, stream, small)
        rest = block.size - size
        split = rest >= MIN_BLOCK if small else rest > SMALL_SIZE  # should_split
        if split:
            tail = _Block(block.segment, block.offset + size, rest, stream, small,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._cache(tail)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self._next_id += 1
        self._handles[self._next_id] = block
        return self._next_id

    def free(self, handle: int) -> None:
        """Return a block to its pool, merged with its free neighbours (``free_block``)."""
        block = self._handles.pop(handle)
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._uncache(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._cache(block)

    def reset_peak(self) -> None:
        """``torch.cuda.reset_peak_memory_stats``: the peaks restart from now."""
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    def reserved_by_stream(self) -> dict[str, int]:
        """The segments' sum per stream: each stream's pool."""
        out: dict[str, int] = {}
        for size, stream in self._segments.values():
            out[stream] = out.get(stream, 0) + size
        return out

    @property
    def cached(self) -> int:
        """Bytes reserved but held by no tensor."""
        return self.reserved - self.allocated

    def _best_fit(self, size: int, stream: str, small: bool) -> _Block | None:
        i = bisect.bisect_left(self._free, (stream, small, size, -1, -1))
        if i == len(self._free) or self._free[i][:2] != (stream, small):
            return None
        block = self._blocks[self._free[i]]
        self._uncache(block)
        return block

    def _new_segment(self, size: int, stream: str, small: bool) -> _Block:
        want = segment_size(size)
        if self.reserved + want > self.capacity:
            self._release_cached()
        self._next_id += 1
        self._segments[self._next_id] = (want, stream)
        self.reserved += want
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return _Block(self._next_id, 0, want, stream, small)

    def _release_cached(self) -> None:
        """``release_cached_blocks``: free every segment no tensor holds a part of."""
        for key in list(self._whole.values()):
            block = self._blocks[key]
            self._uncache(block)
            self.reserved -= self._segments.pop(block.segment)[0]

    def _cache(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self._free, key)
        self._blocks[key] = block
        if block.prev is None and block.next is None:  # a whole segment, free
            self._whole[block.segment] = key

    def _uncache(self, block: _Block) -> None:
        key = block.key()
        self._free.pop(bisect.bisect_left(self._free, key))
        del self._blocks[key]
        self._whole.pop(block.segment, None)  # a segment with a whole free block has no other
