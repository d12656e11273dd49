"""Energy of a simulated step: each GPU's power through the step, plus the host.

A GPU draws one of three levels (the timeline says which, moment by moment):
- computing (any compute kernel runs): its power limit. Dense training kernels hold a card at
  its limit (its board power from the spec sheet, or the lower limit the topology sets);
- communicating only (NCCL kernels, no compute): idle plus the share of the limit's dynamic
  power that the SMs NCCL occupies take (one SM per channel, as the engine already assumes);
- idle (waiting): ``IDLE_SHARE`` of the board power.
The host (CPU sockets, memory, fans) draws ``HOST_W_PER_SOCKET`` per socket, and the power
supply's losses come on top of everything (``PSU_EFFICIENCY``).

Assumes every GPU runs the representative GPU's timeline (ranks are symmetric). No published
per-phase draw of NCCL kernels is in this repository, so the communicating level is the SM
rule above; idle time is a small share of a training step, so the answer moves by a few
percent at most for any idle share between 10% and 30%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator.engine.timeline import Timeline, merge, subtract_length, union_length

if TYPE_CHECKING:
    from simulator.machine.topology import Machine


@dataclass(frozen=True)
class BoardPower:
    watts: float  # board power (TDP / TGP): the default power limit
    source: str


# Spec-sheet board power per catalog GPU (machine/hardware.py names).
BOARD_POWER: dict[str, BoardPower] = {
    "v100-sxm2": BoardPower(300, "NVIDIA V100 datasheet: 300 W (SXM2)"),
    "rtx2080ti": BoardPower(250, "NVIDIA GeForce RTX 2080 Ti spec: 250 W graphics card power"),
    "rtx3090": BoardPower(350, "NVIDIA GeForce RTX 3090 spec: 350 W graphics card power"),
    "rtx3090ti": BoardPower(450, "NVIDIA GeForce RTX 3090 Ti spec: 450 W graphics card power"),
    "rtx4090": BoardPower(450, "NVIDIA GeForce RTX 4090 spec: 450 W total graphics power"),
    "rtx5090": BoardPower(575, "NVIDIA GeForce RTX 5090 spec: 575 W total graphics power"),
    "a100-sxm4-80gb": BoardPower(400, "NVIDIA A100 datasheet: 400 W max TDP (SXM4)"),
    "a100-pcie-80gb": BoardPower(300, "NVIDIA A100 80GB PCIe datasheet: 300 W"),
    "h100-sxm": BoardPower(700, "NVIDIA H100 datasheet: up to 700 W (SXM5)"),
    "h100-pcie": BoardPower(350, "NVIDIA H100 PCIe datasheet: 300-350 W configurable"),
    "h200": BoardPower(700, "NVIDIA H200 datasheet: up to 700 W (SXM)"),
    "h100-nvl": BoardPower(400, "NVIDIA H100 NVL product brief: 350-400 W configurable"),
    "b200": BoardPower(1000, "NVIDIA HGX B200 datasheet: 1000 W per GPU"),
    "l40s": BoardPower(350, "NVIDIA L40S datasheet: 350 W max power"),
    "rtx6000-ada": BoardPower(300, "NVIDIA RTX 6000 Ada datasheet: 300 W max power"),
    "rtx-pro-6000": BoardPower(600, "NVIDIA RTX PRO 6000 Blackwell datasheet: 600 W "
                               "(Workstation Edition)"),
    "rtx-a6000": BoardPower(300, "NVIDIA RTX A6000 datasheet: 300 W max power"),
}
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


def power_limit(machine: Machine) -> float | None:
    """The GPUs' power limit in watts: the topology's (``gpu: {power_limit_w: ...}``, resolved
    in machine/hardware.py), else the board power (None: unknown)."""
    limit = machine.gpu.power_limit
    if limit:
        return float(limit)
    board = BOARD_POWER.get(machine.gpu.name)
    return board.watts if board else None


def sockets(machine: Machine) -> int:
    return sum(1 for node in machine.config.nodes if node.kind == "cpu") or 1


def gpu_joules(timeline: Timeline, limit: float, sms: int) -> float:
    """Joules one GPU draws over the step (the representative GPU's timeline)."""
    idle_w = IDLE_SHARE * limit
    compute = merge((s.start, s.end) for s in timeline.compute_spans())
    busy = union_length(compute)
    comm_only = 0.0
    for span in timeline.comm_spans():  # each collective's exposed part, at its SM share
        exposed = subtract_length([(span.start, span.end)], compute)
        share = min(1.0, float(span.args.get("channels", 1)) / sms)
        comm_only += exposed * (idle_w + share * (limit - idle_w))
    exposed_total = subtract_length([(s.start, s.end) for s in timeline.comm_spans()], compute)
    idle = max(0.0, timeline.step_time - busy - exposed_total)
    return busy * limit + comm_only + idle * idle_w


def step_energy(timeline: Timeline, machine: Machine, tokens_per_step: float, *,
                host_share: float = 1.0) -> dict[str, Any]:
    """``energy: {joules_per_step, avg_power_w, kwh_per_million_tokens}`` (null if unknown).

    ``host_share``: the part of the host the run accounts for (GPUs used / GPUs of the box,
    as the price is charged).
    """
    limit = power_limit(machine)
    step = timeline.step_time
    if limit is None or step <= 0:
        return dict.fromkeys(ENERGY_KEYS)
    gpus = timeline.world * gpu_joules(timeline, limit, machine.gpu.sms)
    host = HOST_W_PER_SOCKET * sockets(machine) * host_share * step
    joules = (gpus + host) / PSU_EFFICIENCY
    kwh_per_token = joules / 3.6e6 / tokens_per_step if tokens_per_step > 0 else None
    return {"joules_per_step": joules, "avg_power_w": joules / step,
            "kwh_per_million_tokens": kwh_per_token * 1e6 if kwh_per_token else None}
