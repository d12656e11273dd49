"""DDP gradient buckets, built exactly as PyTorch's reducer builds them.

Rules, from pytorch/pytorch (v2.13):

- ``torch/nn/parallel/distributed.py`` (``_BucketCapacityConfig.create``): the cap is
  ``int(bucket_cap_mb * 1024 * 1024)`` (MiB, although the docstring says MB); the first
  bucket's limit is ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) only when ``bucket_cap_mb``
  is left at its default (None); a cap given explicitly, even 25, is also the first limit.
- ``torch/csrc/distributed/c10d/reducer.cpp`` (``compute_bucket_assignment_by_size``): walk
  the tensors in order, accumulate bytes per (dtype, device), close a bucket as soon as its
  size is >= the current limit, then move that dtype on to the next limit; leftover open
  buckets are appended at the end. With an explicit index order (the rebuild) the result is
  not sorted; without one it is sorted by smallest tensor index.
- ``Reducer::rebuild_buckets``: after the first iteration, buckets are rebuilt with limits
  [first, cap] over the order in which gradients actually became ready. That steady-state
  plan is what every later iteration uses, and what this module reports by default.
- At construction (``_ddp_init_helper``), the plan is computed over registration order with
  limits [sys.maxsize] (one bucket) unless ``find_unused_parameters=True``, then reversed.
- Up to v1.4 there was no rebuild (the ready-order rebuild is pytorch/pytorch#35137, 2020-03):
  every iteration uses the construction plan, [1 MiB, cap] over registration order whatever
  the cap, reversed (v1.4 ``distributed.py``: "a single small bucket for parameters that are
  defined first"), so the small bucket is the last one reduced (``legacy_bucket_plan``).

Assumes one device per rank. Where several dtypes leave an open bucket at the end, C++
iterates an unordered_map (order unspecified); here they follow the order in which each
dtype was first seen, which is what launch order would look like anyway.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

# torch/csrc/distributed/c10d/reducer.hpp: kDefaultFirstBucketBytes, kDefaultBucketBytesCap
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25.0
MIB = 1024 * 1024  # distributed.py: _MB_TO_BYTES = 1024 * 1024


@dataclass(frozen=True)
class GradTensor:
    """One parameter's gradient as DDP sees it: registration-order entry."""

    name: str
    numel: int
    dtype_bytes: int  # element_size() of the gradient (== the parameter's dtype)
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype_bytes


@dataclass(frozen=True)
class Bucket:
    """One DDP bucket: parameter indices (registration numbering) in bucket order."""

    indices: tuple[int, ...]
    bytes: int  # gradient bytes in the bucket (the bucket buffer's size)
    numel: int
    dtype: str
    size_limit: int  # the limit this bucket was closed against (or left open under)

    @property
    def tensors(self) -> int:
        return len(self.indices)


def size_limits(bucket_cap_mb: float | None) -> list[int]:
    """The reducer's [first, cap] limits for a user's ``bucket_cap_mb`` (None = default)."""
    cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    if cap <= 0:
        raise ValueError(f"bucket cap must be positive, got {bucket_cap_mb} MiB")
    first = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    return [first, cap]


def _as_tensor(param: GradTensor | Sequence[object]) -> GradTensor:
    if isinstance(param, GradTensor):
        return param
    name, numel, dtype_bytes, dtype = param
    return GradTensor(str(name), int(numel), int(dtype_bytes), str(dtype))  # type: ignore[call-overload]


def assign_by_size(tensors: Sequence[GradTensor], order: Sequence[int],
                   limits: Sequence[int], *, sort_by_min_index: bool) -> list[Bucket]:
    """``compute_bucket_assignment_by_size`` over ``tensors`` visited in ``order``."""
    closed: list[Bucket] = []
    open_indices: dict[str, list[int]] = {}  # per dtype, insertion order = first seen
    open_bytes: dict[str, int] = {}
    open_numel: dict[str, int] = {}
    limit_pos: dict[str, int] = {}
    for index in order:
        t = tensors[index]
        open_indices.setdefault(t.dtype, []).append(index)
        open_bytes[t.dtype] = open_bytes.get(t.dtype, 0) + t.nbytes
        open_numel[t.dtype] = open_numel.get(t.dtype, 0) + t.numel
        pos = limit_pos.setdefault(t.dtype, 0)
        limit = limits[pos]
        if open_bytes[t.dtype] >= limit:
            closed.append(Bucket(tuple(open_indices[t.dtype]), open_bytes[t.dtype],
                                 open_numel[t.dtype], t.dtype, limit))
            open_indices[t.dtype], open_bytes[t.dtype], open_numel[t.dtype] = [], 0, 0
            limit_pos[t.dtype] = min(pos + 1, len(limits) - 1)
    for dtype, indices in open_indices.items():
        if indices:
            closed.append(Bucket(tuple(indices), open_bytes[dtype], open_numel[dtype], dtype,
                                 limits[limit_pos[dtype]]))
    if sort_by_min_index:
        closed.sort(key=lambda b: min(b.indices))
    return closed


def bucket_plan(params: Sequence[GradTensor | Sequence[object]], bucket_cap_mb: float | None,
                ready_order: Sequence[int] | None = None) -> list[Bucket]:
    """Steady-state DDP buckets in launch order (after ``Reducer::rebuild_buckets``).

    ``params`` are in registration order (``module.parameters()``, Hugging Face order for
    transformers) as ``GradTensor`` or ``(name, numel, dtype_bytes, dtype)``. ``ready_order``
    lists parameter indices in the order their gradients became ready in backward; without
    it, reverse registration order stands in for it (DDP's own assumption).

    >>> [b.tensors for b in bucket_plan([("a", 1 << 20, 4, "fp32")] * 3, 5)]
    [2, 1]
    """
    tensors = [_as_tensor(p) for p in params]
    order = list(range(len(tensors)))[::-1] if ready_order is None else list(ready_order)
    if sorted(order) != list(range(len(tensors))):
        raise ValueError("ready_order must list every parameter index exactly once")
    return assign_by_size(tensors, order, size_limits(bucket_cap_mb), sort_by_min_index=False)


def legacy_bucket_plan(params: Sequence[GradTensor | Sequence[object]],
                       bucket_cap_mb: float | None) -> list[Bucket]:
    """The plan of PyTorch up to v1.4, kept for every iteration, in launch order.

    >>> [b.tensors for b in legacy_bucket_plan([("a", 1 << 18, 4, "fp32")] * 4, 2)]
    [2, 1, 1]
    """
    tensors = [_as_tensor(p) for p in params]
    cap = size_limits(bucket_cap_mb)[1]
    plan = assign_by_size(tensors, range(len(tensors)), [DEFAULT_FIRST_BUCKET_BYTES, cap],
                          sort_by_min_index=True)
    return plan[::-1]


def initial_bucket_plan(params: Sequence[GradTensor | Sequence[object]],
                        bucket_cap_mb: float | None,
                        find_unused_parameters: bool = False) -> list[Bucket]:
    """The iteration-0 plan DDP builds at construction (``_ddp_init_helper``), in launch order.

    Without ``find_unused_parameters`` it is one bucket of everything (limit sys.maxsize);
    with it, [first, cap] over registration order, sorted, then reversed (never rebuilt).
    """
    tensors = [_as_tensor(p) for p in params]
    first, cap = size_limits(bucket_cap_mb)
    if not find_unused_parameters:
        limits = [sys.maxsize]
    elif first < cap:
        limits = [first, cap]
    else:
        limits = [cap]
    plan = assign_by_size(tensors, range(len(tensors)), limits, sort_by_min_index=True)
    # distributed.py: "reverse list of buckets because we want to approximate the order in
    # which their gradients are produced" (the order inside each bucket is kept).
    return plan[::-1]
