"""How long an op takes on one GPU: a roofline per kernel plus a launch overhead; and MFU.

Each kernel of an op (simulator/job/ops.py) takes
    max(flops / achievable compute rate, bytes / achievable memory bandwidth) + launch overhead
and an op takes the sum over its kernels (kernels of one stream run one after another).
GEMM-like kernels (``gemm``, ``dense``) with 4-byte operands (fp32 training) run at the FP32
rate, others at the 16-bit tensor-core rate. Assumes one kernel has the GPU to itself
(communication kernels slowing compute are the engine's business, not this module's).
"""

from __future__ import annotations

import math
from functools import cache

from simulator.catalog import power
from simulator.catalog.gpus import FP32_GEMM_SHARE, GPU, GPUS, achievable_memory_bandwidth, median
from simulator.catalog.software import FLASH1_SLOWDOWN, FLASH2_MIN_SM
from simulator.job.ops import Kernel, Op
from simulator.job.workload import Job
from simulator.units import US

# Per-kernel launch overhead: CUDA kernel launch latency is a few microseconds (NVIDIA,
# "Getting Started with CUDA Graphs", 2019: ~3-4 us per back-to-back launched kernel);
# we take 5 us, which also covers PyTorch's per-op dispatch on small kernels.
LAUNCH_OVERHEAD = 5 * US


# FlashAttention's share of the spec dense 16-bit peak (FP32 accumulate), forward and backward,
# by architecture and version; causal FLOPs counted halved, as attention.py does.
FLASH_EFFICIENCY: dict[tuple[str, int], tuple[float, float]] = {
    # FA2 paper (Dao 2023, arXiv:2307.08691, section 4.1, A100): forward 50-73% of peak,
    # backward up to ~63%; the middle of each range
    ("ampere", 2): (0.60, 0.50),
    # the same mma.sync kernels on GA10x/AD10x/GB20x (100 KB of shared memory per SM); an RTX
    # A5000 (GA102) measured 81 TFLOPS forward and 77 backward of its 111 at head dim 64
    # (gpu-mode/ring-attention issue 10), above A100's share: the A100 figures are kept
    ("ada", 2): (0.60, 0.50), ("blackwell-geforce", 2): (0.60, 0.50),
    # H100, flash-attention benchmarks/benchmark_attn.py, head dim 128, seqlen 8192
    # (Dao-AILab/flash-attention PR 1791): FA2 370 / 291 TFLOPS forward / backward, FA3 659 /
    # 554, of 989 (the FA3 paper, Shah et al. 2024, arXiv:2407.08608: FA2 "only 35% utilization
    # on the H100")
    ("hopper", 2): (370 / 989, 291 / 989), ("hopper", 3): (659 / 989, 554 / 989),
    # B200: no published FA2/SDPA training figure here; taken as Hopper's FA2 (assumption)
    ("blackwell", 2): (370 / 989, 291 / 989),
    # Volta/Turing run no FlashAttention-2: sdpa runs its memory-efficient (CUTLASS) kernel
    # there (software.kernel_on_gpu), and these rows are that kernel's: assumption, about half
    # the Ampere share. On V100 it ran about as fast as eager PyTorch attention
    # (facebookresearch/xformers PR 362: forward 5% slower, backward 15% slower, medians)
    ("volta", 2): (0.30, 0.25), ("turing", 2): (0.30, 0.25),
}
# Under a causal mask, where a measurement of both exists (same PR 1791 run): FA2 284 / 287,
# FA3 630 / 532 TFLOPS. Elsewhere the causal share is taken as the non-causal one.
CAUSAL_FLASH_EFFICIENCY: dict[tuple[str, int], tuple[float, float]] = {
    ("hopper", 2): (284 / 989, 287 / 989), ("hopper", 3): (630 / 989, 532 / 989),
    ("blackwell", 2): (284 / 989, 287 / 989),
}
FLASH_FWD_EFFICIENCY, FLASH_BWD_EFFICIENCY = FLASH_EFFICIENCY[("ampere", 2)]
# flash-attn's Triton kernel (flash_attn_triton.py; llm-foundry's attn_impl: triton): the FA2
# paper (arXiv:2307.08691, section 4.1) measures FA2 "1.3-2.5x faster than FlashAttention in
# Triton" on A100; the geometric middle, 1.8, on every architecture (the kernel predates
# Triton's Hopper instructions, so it runs the same mma.sync path FA2 does there).
TRITON_FLASH_SLOWDOWN = 1.8
# sdpa's memory-efficient kernel (xformers' CUTLASS FMHA, in PyTorch since 2.0), the one a
# padding mask leaves it: taken at FlashAttention-1's rate, FA2's / FLASH1_SLOWDOWN. Its forward
# ran 5% under FlashAttention-1 on A100 on average (facebookresearch/xformers PR 362, 2022-08)
# and about half as fast as FA2's on an A40 (xformers issue 1074, 2024-07); a 16-layer
# training step took 297 ms against FlashAttention-1's 292 (pytorch/pytorch PR 92917,
# 2023-01). Uncertain backward: PR 362 had it 55% under FlashAttention-1 before later
# rewrites, so the kernel may be slower still.
MEM_EFFICIENT_SLOWDOWN = FLASH1_SLOWDOWN
TF32_PER_16BIT = 0.5  # TF32 tensor rate over the 16-bit (FP32-accumulate) one, every arch
# sdpa's memory-efficient kernel given fp32 (fp32 training) multiplies in fp32: from sm80 on the
# tensor cores as three TF32 products per fp32 one (CUTLASS 3xTF32: PyTorch's
# mem_eff_attention/gemm_kernel_utils.h DefaultGemmType<ArchTag >= 80, float> uses
# OpMultiplyAddFastF32), before sm80 on the CUDA cores (OpClassSimt). Measured on an A100 (the
# xformers CUTLASS kernel PyTorch ships), fp32 over fp16 time: forward 5843.4 / 1679.2 and
# 13157.7 / 3090.0 us (facebookresearch/xformers PR 587: B=64, M=1024, H=16, K=64 and 128),
# backward 2335.2 / 613.4 and 2241.3 / 583.6 us (PR 467: B=384, M=197, K=88 and 80); their
# median on every card from sm80 (assumption: the same kernel, TF32 at half the 16-bit rate
# everywhere); before sm80 the CUDA cores' fp32 GEMM rate over the 16-bit one.
FP32_ATTENTION_SLOWDOWN = median(
    [5843.4 / 1679.2, 13157.7 / 3090.0, 2335.2 / 613.4, 2241.3 / 583.6])
TF32_MIN_SM = 80


def flash_efficiency(gpu: GPU, version: int = 2, backward: bool = False,
                     causal: bool = False) -> float:
    """FlashAttention's share of ``gpu.matmul_flops``; FA3 only exists on Hopper (elsewhere
    FA2 runs)."""
    arch = gpu.arch
    if arch == "blackwell" and gpu.compute_capability >= 120:  # GeForce / RTX PRO (sm120)
        arch = "blackwell-geforce"
    if (arch, version) not in FLASH_EFFICIENCY:
        version = 2
    table = CAUSAL_FLASH_EFFICIENCY if causal and (arch, version) in \
        CAUSAL_FLASH_EFFICIENCY else FLASH_EFFICIENCY
    shares = table.get((arch, version)) or FLASH_EFFICIENCY[("ampere", 2)]
    return shares[1] if backward else shares[0]

# GEMM tile for wave quantisation: cuBLAS / CUTLASS large-tile kernels on Ampere and later use
# 128x128 (or larger) output tiles per thread block, one block per SM at a time for big tiles
# (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": tile and wave
# quantisation). A GEMM whose tiles do not fill the last wave wastes the idle SMs; a dimension
# that is not a multiple of the tile pads its last tile with work that is thrown away.
GEMM_TILE = 128
# Main-loop fill and drain of a multistage GEMM, in elements of k: CUTLASS's SM80 kernels keep
# 3 stages of 64-wide k tiles in flight (cutlass/gemm/threadblock/default_mma.h,
# kStages = 3), so (stages - 1) x 64 of k-work is spent before the first MMA and after the last.
# A GEMM with a short k (a LoRA rank, a small head) loses that share. Assumption from the
# kernel structure, not a measurement.
GEMM_K_PIPELINE = 128
# The shape the catalog's plain rates were measured on (validation/frameworks.yaml gemm points:
# one torch.matmul with m = n = k = 8192): rates are per reference-shape efficiency.
REFERENCE_GEMM = (8192, 8192, 8192)


# Two kinds of published GEMM figure: MAMF (stas00), the best rate over a sweep of shapes, and
# one plain large torch.matmul (mli/transformers-benchmarks). A model's GEMMs have fixed shapes,
# so the plain figure is what they see. A100 SXM4 has both: 230 / 271.2 TFLOPS.
PLAIN_PER_MAMF = 230 / 271.2


def _derived_plain_rate(gpu: GPU) -> float | None:
    if gpu.plain_matmul_flops:
        return gpu.plain_matmul_flops
    if gpu.measured_matmul_flops:
        return gpu.measured_matmul_flops * PLAIN_PER_MAMF
    return None


@cache
def plain_to_spec(line: str) -> float:
    """Median plain-matmul/spec ratio over catalog GPUs of one product line with a published
    (or MAMF-derived) rate."""
    ratios = [rate / g.matmul_flops for g in GPUS.values()
              if g.line == line and (rate := _derived_plain_rate(g)) is not None]
    return median(ratios)


def matmul_rate(gpu: GPU) -> float:
    """Achievable dense 16-bit FLOP/s of a large plain GEMM benchmark at the enforced power
    limit: plain-matmul measured, else from MAMF, else spec x the median ratio of its product
    line; slowed with the SM clock under a lower power limit (simulator/catalog/power.py), and
    at the share the job's cuBLAS generation reaches (catalog/software.py GEMM_ROWS)."""
    return _tensor_rate(gpu) * gpu.half_dtype_share


def _tensor_rate(gpu: GPU) -> float:
    """``matmul_rate`` on the tensor cores, whatever the job's 16-bit dtype gets of it."""
    rate = _derived_plain_rate(gpu) or gpu.matmul_flops * plain_to_spec(gpu.line)
    return rate * power.clock_share(gpu) * gpu.gemm_library_share


def sustained_share(gpu: GPU) -> float:
    """Tensor-core work of a training step runs for seconds, not a benchmark's milliseconds:
    at the clock the card holds at its power limit, measured where published, else the one its
    datasheet rates its tensor peak at (GPU.tensor_clock_share)."""
    return gpu.tensor_clock_share


def fp32_rate(gpu: GPU) -> float:
    """Achievable dense FP32 FLOP/s (CUDA cores; PyTorch does not use TF32 for matmuls by
    default) at the card's power limit: its measured fp32 GEMM rate, else its spec FP32 rate
    at the share measured cards of its generation reach (gpus.FP32_GEMM_SHARE), else at the
    share of its spec its 16-bit GEMMs reach (assumption: the same clock and power limits bind
    both paths)."""
    if gpu.fp32_matmul_flops:
        return gpu.fp32_matmul_flops * power.clock_share(gpu)
    if gpu.fp32_flops is None:  # every catalog GPU has the figure; this guards new entries
        return _tensor_rate(gpu)
    if gpu.compute_capability in FP32_GEMM_SHARE:
        return gpu.fp32_flops * FP32_GEMM_SHARE[gpu.compute_capability] * power.clock_share(gpu)
    return gpu.fp32_flops * _tensor_rate(gpu) / gpu.matmul_flops


def fp32_attention_share(gpu: GPU) -> float:
    """What an fp32 attention kernel gets of the card's 16-bit tensor rate (above)."""
    if gpu.compute_capability >= TF32_MIN_SM:
        return 1 / FP32_ATTENTION_SLOWDOWN
    return fp32_rate(gpu) / _tensor_rate(gpu)


def memory_rate(gpu: GPU) -> float:
    return achievable_memory_bandwidth(gpu)


def memory_time(nbytes: float, gpu: GPU) -> float:
    """One memory-bound kernel moving ``nbytes`` through HBM (copies, scaling)."""
    return (nbytes / memory_rate(gpu) + LAUNCH_OVERHEAD) / achieved(gpu)


def wave_efficiency(m: int, n: int, sms: int) -> float:
    """Share of SM time doing useful work: output tiles over tiles the waves could hold."""
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def gemm_efficiency(m: int, n: int, k: int, sms: int) -> float:
    """Share of the tensor cores' time a GEMM of this shape spends on its own FLOPs: waves,
    padding of partial tiles, and the k pipeline's fill and drain."""
    tiles_m, tiles_n = math.ceil(m / GEMM_TILE), math.ceil(n / GEMM_TILE)
    padding = m * n / (tiles_m * tiles_n * GEMM_TILE**2)
    return wave_efficiency(m, n, sms) * padding * k / (k + GEMM_K_PIPELINE)


def gemm_rate(m: int, n: int, k: int, gpu: GPU, element_bytes: int = 2) -> float:
    """FLOP/s of one (m, n, k) GEMM: the large-GEMM rate scaled by its shape's efficiency
    relative to the reference shape the rate was measured on."""
    dense = fp32_rate(gpu) if element_bytes == 4 else matmul_rate(gpu)
    return dense * gemm_efficiency(m, n, k, gpu.sms) / gemm_efficiency(*REFERENCE_GEMM, gpu.sms)


def _flash_version(k: Kernel) -> int:
    return 3 if k.name.startswith("flash3") else 2


def _flash_slowdown(k: Kernel, gpu: GPU) -> float:
    """Triton's, FlashAttention-1's and sdpa's memory-efficient kernels against
    FlashAttention-2's rate. Below sm80, where FlashAttention-2 does not run, the table's row
    is already theirs (the memory-efficient kernel's; FlashAttention-1's forward ran within 5%
    of it on A100, xformers PR 362)."""
    if k.name.startswith("triton"):
        return TRITON_FLASH_SLOWDOWN
    if gpu.compute_capability < FLASH2_MIN_SM:
        return 1.0
    if k.name.startswith("mem_efficient"):
        return MEM_EFFICIENT_SLOWDOWN
    return FLASH1_SLOWDOWN if k.name.startswith("flash1") else 1.0


def kernel_time(k: Kernel, gpu: GPU) -> float:
    """Roofline time of one kernel of a training step; tensor-core work at the sustained
    clock (sustained_share), FP32 CUDA-core work at the benchmark's."""
    return kernel_work_time(k, gpu) / achieved(gpu)


def kernel_work_time(k: Kernel, gpu: GPU) -> float:
    """``kernel_time`` before the achieved-rate factor (``achieved``): the part a range's
    re-runs and a calibration's fraction leave unchanged."""
    # fp32, and bf16 where the CUDA cores emulate it (half_dtype_share): at the benchmark's
    # clock; an attention kernel given either multiplies in fp32 (fp32_attention_share: sdpa's
    # math kernel upcasts bf16 below sm80, PyTorch >= 2.5, pytorch/pytorch PR 128922)
    fp32 = k.element_bytes == 4 or gpu.half_dtype_share < 1
    tensor = 1.0 if fp32 else sustained_share(gpu)
    dense_rate = fp32_rate(gpu) if k.element_bytes == 4 else matmul_rate(gpu)
    # cuDNN runs fp32 convolutions in TF32 on Ampere and later (PyTorch's default
    # torch.backends.cudnn.allow_tf32 = True): the tensor cores at half their 16-bit rate
    # (spec sheets: A100 156 / 312, H100 SXM 494.7 / 989.4, RTX 3090 35.6 / 71,
    # RTX 4090 82.6 / 165.2, RTX 5090 104.8 / 209.5 TFLOPS dense): about 1.5x a GeForce card's
    # measured fp32 GEMM rate, 6x an A100's.
    tf32 = k.name.endswith("_tf32") and gpu.compute_capability >= TF32_MIN_SM
    if tf32 and k.kind == "gemm" and k.shape is not None:
        rate = gemm_rate(*k.shape, gpu, 2) * sustained_share(gpu) * TF32_PER_16BIT
    elif tf32 and k.kind == "dense":
        rate = matmul_rate(gpu) * sustained_share(gpu) * TF32_PER_16BIT
    elif k.kind == "gemm" and k.shape is not None:
        rate = gemm_rate(*k.shape, gpu, k.element_bytes) * tensor
    elif k.kind in ("attention_fwd", "attention_bwd"):
        share = flash_efficiency(gpu, _flash_version(k), backward=k.kind == "attention_bwd",
                                 causal=k.name.endswith("_causal")) / _flash_slowdown(k, gpu)
        dtype_share = fp32_attention_share(gpu) if fp32 else 1.0
        rate = gpu.matmul_flops * dtype_share * power.clock_share(gpu) * tensor * share
    elif k.kind == "dense":
        rate = dense_rate * tensor
    else:  # memory-bound elementwise work: FLOPs on CUDA cores never bind here
        rate = math.inf
    compute = k.flops / rate if k.flops else 0.0
    return max(compute, k.bytes / memory_rate(gpu)) + LAUNCH_OVERHEAD


def memory_bound(k: Kernel, gpu: GPU, work: float | None = None) -> bool:
    """Whether a kernel's time is its memory traffic's (what a collective's use of the
    memory bandwidth slows: nccl/interference.py); ``work``: its kernel_work_time, where the
    caller has it."""
    busy = (kernel_work_time(k, gpu) if work is None else work) - LAUNCH_OVERHEAD
    return busy > 0 and k.bytes / memory_rate(gpu) >= busy * (1 - 1e-12)


def achieved(gpu: GPU) -> float:
    """What the model's kernel times are divided by: the achieved-rate factor ranges
    propagate (``rate_scale``, machine/scales.py) times the fraction a measured step of the
    user's job reached (``achieved_fraction``, a calibrated topology's calibration.compute).
    Both scale whole kernels, as the one-GPU steps they come from measure them."""
    return gpu.rate_scale * gpu.achieved_fraction


def op_time(op: Op, gpu: GPU) -> float:
    """Seconds for one op on an otherwise idle GPU."""
    return sum(kernel_time(k, gpu) for k in op.kernels)


def step_compute_time(job: Job, gpu: GPU) -> float:
    """One optimizer step on one GPU, compute only (no communication): all micro-batches'
    forward and backward (recompute included), then the optimizer."""
    micro = sum(op_time(op, gpu) for op in job.forward_ops() + job.backward_ops())
    return micro * job.grad_accum + sum(op_time(op, gpu) for op in job.optimizer_ops())


def samples_per_second(job: Job, gpu: GPU) -> float:
    """Single-GPU training throughput (samples/s) from compute alone."""
    return job.micro_batch * job.grad_accum / step_compute_time(job, gpu)


def mfu(model_flops: float, step_time: float, gpu: GPU, n_gpus: int = 1) -> float:
    """Model FLOPs utilisation: the step's model FLOPs over n_gpus x step time x spec peak.

    `model_flops` is the whole step's count over all `n_gpus` GPUs (one GPU's is
    Job.model_flops_per_step()); the peak is the spec dense 16-bit rate, as Megatron-LM and
    llm-foundry report MFU.
    """
    if step_time <= 0:
        return 0.0
    return model_flops / (n_gpus * step_time * gpu.matmul_flops)
