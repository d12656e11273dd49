"""How a board power limit below the default slows a GPU's tensor-core work.

The model is CMOS dynamic-voltage-frequency scaling: a card's power is a part that does not
follow the SM clock (leakage, HBM/GDDR, fans and I/O) plus a dynamic part C V^2 f, and along the
DVFS curve the voltage rises with the clock, so the dynamic part grows as f^3. A large GEMM at
the default limit draws the whole limit (that is the condition of the catalog's measured rates),
so under a lower limit P the sustained clock falls to

    f / f_default = ((P - s * TDP) / ((1 - s) * TDP)) ** (1/3)

and tensor-core and CUDA-core rates fall with it. A limit at or above the default changes
nothing: the measured rate may already be clock- rather than power-bound, and nothing says by
how much it could rise. Memory-bound kernels keep their bandwidth: HBM runs on its own clock,
and bandwidth-bound work draws well under the limit (arXiv:2605.11999: memory-bound LLM decode
draws 137-300 W on a 700 W H200 and never reaches a cap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.catalog.gpus import GPU

# Share of the default board power that does not scale with the SM clock. The model above
# fitted to a published cuBLAS GEMM under two limits, GB300 617 TFLOPS at 500 W against
# 1600-2174 at its 1400 W default (facebookexperimental/triton PR 2023), gives 0.32-0.34 at that
# extreme cap; an H100 breakdown puts leakage near 30% of 700 W (fridayswithfaraday.com, "GPU
# Power Efficiency"). We take 0.25 so the model stays defined down to the lowest limit
# nvidia-smi accepts on an H100 (200 W = 0.29 TDP). Between 0.25 and 0.33 an H100 at 500 W
# runs 83-85% of its default clock: about +-1% on the rate.
STATIC_SHARE = 0.25
# Below the clock-independent draw the card sits at its lowest clocks; a floor keeps times finite.
MIN_CLOCK_SHARE = 0.1


def clock_share(gpu: GPU) -> float:
    """Sustained SM clock under the enforced power limit, as a share of the default's."""
    tdp, limit = gpu.tdp_w, gpu.power_limit
    if tdp <= 0 or limit >= tdp:
        return 1.0
    static = STATIC_SHARE * tdp
    share = (max(limit - static, 0.0) / (tdp - static)) ** (1 / 3)
    return max(MIN_CLOCK_SHARE, float(share))
