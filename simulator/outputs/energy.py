"""Energy of a simulated step: each GPU's power through the step, plus the host.

A GPU draws one of three levels (the timeline says which, moment by moment):
- computing (any compute kernel runs): its power limit. Dense training kernels hold a card at
  its limit (its board power from the spec sheet, or the lower limit the topology sets);
- communicating only (NCCL kernels, no compute): idle plus the share of the limit's dynamic
  power that the SMs NCCL occupies take (one SM per channel, as the engine already assumes);
- idle (waiting): ``IDLE_SHARE`` of the board power.
The host (CPU sockets, memory, fans) draws ``HOST_W_PER_SOCKET`` per socket, and the power
supply's losses come on top of everything (``PSU_EFFICIENCY``).

Each group of identical ranks is counted from its first GPU's timeline. No published
per-phase draw of NCCL kernels is in this repository, so the communicating level is the SM
rule above; idle time is a small share of a training step, so the answer moves by a few
percent at most for any idle share between 10% and 30%.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.engine.timeline import (
    Span,
    Timeline,
    merge,
    subtract_length,
    uncovered_lengths,
    union_length,
)

if TYPE_CHECKING:
    from simulator.catalog.gpus import GPU
    from simulator.machine.topology import Machine


# Assumption, no measurement in this repository: a waiting GPU (context alive, memory
# powered, clocks up between kernels) draws a fifth of its board power.
IDLE_SHARE = 0.20
# Assumption: a server socket with its memory at the light CPU load of GPU training (data
# loading, NCCL proxy threads) draws about 200 W: half a 270-350 W server CPU's TDP plus its
# DIMMs. Latif et al. 2024 (arXiv:2412.08602) measured an 8x H100 HGX node at up to 8.4 kW in
# training, which leaves more (up to 2.8 kW for CPUs, NVSwitches, NICs and fans) on that box.
HOST_W_PER_SOCKET = 200.0
# 80 PLUS Platinum: 92% efficiency at 50% load (115 V internal PSU), the usual server grade.
PSU_EFFICIENCY = 0.92

ENERGY_KEYS = ("joules_per_step", "avg_power_w", "kwh_per_million_tokens")


def power_limit(gpu: GPU) -> float | None:
    """A card's power limit in watts: the topology's (``gpu: {power_limit_w: ...}``, resolved
    in catalog/), else its catalog board power (None: unknown)."""
    return float(gpu.power_limit) if gpu.power_limit else None


def sockets(machine: Machine) -> int:
    return sum(1 for node in machine.config.nodes if node.kind == "cpu") or 1


def gpu_joules(timeline: Timeline, gpu: int, limit: float, sms: int) -> float:
    """Joules one GPU draws over the step, from its own spans (its rank group's)."""
    idle_w = IDLE_SHARE * limit
    intervals: list[tuple[float, float]] = []
    comm: list[Span] = []
    roles: dict[str, str] = {}  # Span.is_compute and is_comm read the kind alone
    for s in timeline.spans_of(gpu):  # Timeline.compute_spans and comm_spans, in one pass
        role = roles.get(s.kind)
        if role is None:
            role = roles[s.kind] = "compute" if s.is_compute else "comm" if s.is_comm else ""
        if role == "compute":
            intervals.append((s.start, s.end))
        elif role:
            comm.append(s)
    compute = merge(intervals)
    busy = union_length(compute)
    comm_only = 0.0
    exposed_parts = uncovered_lengths([(s.start, s.end) for s in comm], compute)
    for span, exposed in zip(comm, exposed_parts, strict=True):  # at the collective's SM share
        share = min(1.0, float(span.args.get("channels", 1)) / sms)
        comm_only += exposed * (idle_w + share * (limit - idle_w))
    exposed_total = subtract_length([(s.start, s.end) for s in comm], compute)
    idle = max(0.0, timeline.step_time - busy - exposed_total)
    return busy * limit + comm_only + idle * idle_w


def step_energy(timeline: Timeline, machine: Machine, tokens_per_step: float, *,
                host_share: float = 1.0) -> dict[str, Any]:
    """``energy: {joules_per_step, avg_power_w, kwh_per_million_tokens}`` (null if unknown).

    ``host_share``: the part of the host the run accounts for (GPUs used / GPUs of the box,
    as the price is charged).
    """
    step = timeline.step_time
    gpus = 0.0
    for group in timeline.rank_groups:  # ranks that differ (pipeline stages, mixed cards)
        card = machine.gpu_of(group[0])
        limit = power_limit(card)
        if limit is None or step <= 0:
            return dict.fromkeys(ENERGY_KEYS)
        gpus += len(group) * gpu_joules(timeline, group[0], limit, card.sms)
    host = HOST_W_PER_SOCKET * sockets(machine) * host_share * step
    joules = (gpus + host) / PSU_EFFICIENCY
    kwh_per_token = joules / 3.6e6 / tokens_per_step if tokens_per_step > 0 else None
    return {"joules_per_step": joules, "avg_power_w": joules / step,
            "kwh_per_million_tokens": kwh_per_token * 1e6 if kwh_per_token else None}
