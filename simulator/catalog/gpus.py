"""The GPU catalog: each card's compute rates, memory, SMs, NVLink and PCIe, power and price,
every number with its source. Bandwidths are bytes/s (1 GB/s = 1e9 B/s), memory is bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError, quoted
from simulator.units import GB

GiB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One GPU model: its compute rates, memory, SMs, NVLink and PCIe, power and price."""

    name: str
    arch: str  # volta | turing | ampere | ada | hopper | blackwell
    compute_capability: int  # 80 = sm80; NCCL indexes its tables by this
    sms: int
    memory_bytes: int
    memory_bandwidth: float  # B/s, spec sheet
    matmul_flops: float  # dense 16-bit tensor FLOP/s with FP32 accumulate, spec sheet
    measured_matmul_flops: float | None  # MAMF: best GEMM rate over a shape sweep (stas00)
    nvlink_links: int  # NVLink links per GPU (0: none)
    pcie_gen: int
    source: str
    # price per card (USD) for per-dollar comparisons and buy-versus-rent; the date and source
    # of each are in PRICE_SOURCES below
    price_usd: float | None = None
    # one large torch.matmul, m = n = k = 8192, 16-bit inputs (validation/frameworks.yaml gemm
    # points, mli/transformers-benchmarks): the achieved rate at the card's default power limit
    plain_matmul_flops: float | None = None
    # GeForce cards boost above their spec clocks, data-centre parts run below (power caps),
    # so measured/spec ratios are taken within a product line (compute.py)
    line: str = "datacenter"
    # dense FP32 FLOP/s on the CUDA cores (no tensor cores, no TF32), spec sheet: what an
    # fp32 run's convolutions and GEMMs get on cards without TF32 (Volta, Turing)
    fp32_flops: float | None = None
    # one large fp32 torch.matmul (no TF32: PyTorch's default), measured (the note above
    # GPUS): SGEMM reaches about two thirds of a GeForce card's spec FP32 (Ampere and later
    # count a second FP32 path GEMMs do not keep busy) and nearly all of a data-centre card's;
    # None: the spec at the share measured cards of its generation reach (FP32_GEMM_SHARE)
    fp32_matmul_flops: float | None = None
    tdp_w: float = 0.0  # default board power limit (spec sheet): the measured rates' condition
    power_limit_w: float | None = None  # an enforced lower limit (nvidia-smi -pl); None = TDP
    # multiplier on achieved compute rates, 1.0 in the catalog; only Machine.with_scales sets
    # it, to propagate ranges (simulator/machine/scales.py)
    rate_scale: float = 1.0
    # modelled / measured compute time of the user's own job on this card, 1.0 in the catalog;
    # only Machine.for_job sets it, from the topology's calibration.compute (stepsim calibrate)
    achieved_fraction: float = 1.0
    # the share of the plain GEMM rate the job's cuBLAS generation reaches, 1.0 in the catalog
    # (today's stack); only Machine.for_job sets it, from catalog/software.py GEMM_ROWS
    gemm_library_share: float = 1.0
    # the topology gives this card's own measured plain GEMM rate (matmul_tflops), which no
    # library table then scales
    own_matmul: bool = False
    # the SM clock sustained tensor-core work holds at the default power limit, measured, over
    # the clock the catalog's GEMM benchmark ran at (TENSOR_PER_FP32's note); None: not measured
    sustained_clock_share: float | None = None
    # the share of the 16-bit tensor rate the job's 16-bit dtype gets, 1.0 in the catalog; only
    # Machine.for_job sets it: bf16 on a card without bf16 tensor cores (BF16_MIN_SM) runs its
    # matmuls on the CUDA cores
    half_dtype_share: float = 1.0

    @property
    def power_limit(self) -> float:
        """The board power limit in force, W."""
        return self.power_limit_w if self.power_limit_w is not None else self.tdp_w

    @property
    def tensor_clock_share(self) -> float:
        """The clock sustained tensor-core work runs at, as a share of the clock a short GEMM
        benchmark reaches: a datasheet that rates its tensor peak below its FP32 peak's clock
        says so (module note on TENSOR_PER_FP32); 1.0 where the two clocks agree or the
        per-clock ratio of the architecture is not known; a measured sustained clock
        (``sustained_clock_share``) before either."""
        if self.sustained_clock_share is not None:
            return self.sustained_clock_share
        per_clock = TENSOR_PER_FP32.get(self.compute_capability)
        if per_clock is None or not self.fp32_flops:
            return 1.0
        return min(1.0, self.matmul_flops / (per_clock * self.fp32_flops))


_T = 1e12
# bf16 tensor cores arrive with Ampere (sm80; NVIDIA A100 whitepaper: "BF16 ... new in A100");
# below it PyTorch runs bf16 where it can emulate it (torch.cuda.is_bf16_supported
# including_emulation) and cuBLAS multiplies bf16 on the CUDA cores, slower than its own fp32
# GEMMs. The share of the fp16 tensor rate a bf16 GEMM gets there, measured per card as bf16
# over fp16 TFLOPS of one torch.matmul run (zzc0721/torch-performance-test-data, PyTorch 2.6-2.8):
# RTX 2080 Ti 6.95 / 49.61 (issue 181, 8192^3; its fp32 11.52), V100-SXM2-16GB 10.65 / 97.36
# (issue 140, 8192^3; its fp32 14.38), T4 2.46 / 41.91 and 2.27 / 42.71 (database.md: Colab,
# Kaggle, best over the sizes). A card without its own takes its architecture's median, uncertain
# by about 2x: Turing boards of that set run 0.054 (T4) to 0.14 (RTX 2080 Ti), TU104 4.26 / 56.01
# (issue 90) and TITAN RTX 4.82 / 53.86 (issue 127) between.
BF16_MIN_SM = 80
BF16_EMULATED_SHARE = {"rtx2080ti": 6.95 / 49.61, "v100-sxm2": 10.65 / 97.36,
                       "t4": (2.46 / 41.91 + 2.27 / 42.71) / 2}


def median(values: list[float]) -> float:
    """The middle value (the mean of the two middle ones of an even count), without importing
    statistics (and its fractions and decimal) into every run."""
    ordered = sorted(values)
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2


def half_dtype_share(card: GPU, precision: str) -> float:
    """The share of ``card``'s 16-bit tensor rate a job of ``precision`` gets: bf16 below
    BF16_MIN_SM the card's measured emulated share, else the median of its architecture's
    measured cards (a card of an architecture without one: its FP32 CUDA-core rate's, an upper
    bound: every emulated bf16 GEMM above ran slower than fp32); all of it otherwise."""
    if precision not in ("bf16", "pure-bf16") or card.compute_capability >= BF16_MIN_SM:
        return 1.0
    if card.name in BF16_EMULATED_SHARE:
        return BF16_EMULATED_SHARE[card.name]
    kin = [share for name, share in BF16_EMULATED_SHARE.items() if GPUS[name].arch == card.arch]
    if kin:
        return median(kin)
    return card.fp32_flops / card.matmul_flops if card.fp32_flops else 1.0


# Dense 16-bit tensor-core FLOPs per FP32 CUDA-core FLOP, per SM and clock, by compute
# capability: A100 whitepaper (GA100 SM: 4 tensor cores x 512 FP16 FLOP/clk = 2048 against
# 64 FP32 lanes x 2 = 128) and H100 whitepaper (4 x 1024 = 4096 against 128 x 2 = 256). Both are
# 16, so a datasheet's two peaks at one clock differ by exactly 16x. A100's do (312 = 16 x 19.5,
# both at its 1410 MHz boost). H100 SXM's do not: FP32 67 TFLOPS = 132 SMs x 256 x 1.98 GHz,
# its maximum clock (torch.cuda._device_limits derives 1070.5 bf16 TFLOPS from that clock,
# pytorch PR #172523), but BF16 989.4 = 132 x 4096 x 1.83 GHz: NVIDIA rates tensor work at the
# clock the card holds within its power limit. A short benchmark (the catalog's plain GEMM,
# 6 warm-up + 30 iterations of 1.4 ms in zzc0721/torch-performance-test-data test.py) runs at
# the maximum clock before the power controller settles; a training step runs for seconds at
# the rated one: 1830 / 1980 = 0.924 (PCIe 0.926, NVL 0.87 from their datasheets' pairs).
TENSOR_PER_FP32: dict[int, float] = {80: 16.0, 90: 16.0}
# Where the clock full tensor load holds at the power limit is measured, it is lower than the
# datasheet's: GH100 at its 700 W limit "cannot reliably sustain a locked 1830 MHz", 1500 MHz
# being "a more realistic sustained" one (H200 runners, tile-ai/TileOPs issue 1587,
# 2026-06-16), and GEMMs overlapped with communication fell "from 1980MHz to 1575 MHz"
# (deepseek-ai/DeepGEMM issue 120, 2025-06-25, the Hopper card not named). Neither is an H100
# SXM itself: the same die at the same limit. Their mean over the 1980 MHz the benchmark runs
# at: 0.78 (0.76-0.80 from the two; a lighter load holds more, up to the datasheet's 0.924).
# The same gap shows on A100, whose catalog rate is already a sustained one (mli's
# micro_bench.ipynb times each GEMM for at least 3 s, blocked_autorange(min_run_time=3): 230
# TFLOPS) against 258.7 fp16 in zzc0721's 42 ms run on a later stack.
GH100_SUSTAINED_MHZ = (1500 + 1575) / 2
GH100_MAX_MHZ = 1980  # H100 SXM datasheet FP32 67 TFLOPS = 132 SMs x 256 x 1.98 GHz
GH100_SUSTAINED_SHARE = GH100_SUSTAINED_MHZ / GH100_MAX_MHZ
# GPU.fp32_matmul_flops: zzc0721/torch-performance-test-data (test.py: torch.matmul of square
# fp32 matrices, 1024 to 10240), PyTorch 2.4-2.8: its issues' 8192 figure (V100-SXM2-16GB
# issue 140, RTX 2080 Ti issue 181), else database.md's best over the sizes (the median card
# where it lists several: RTX 3090 24.46 / 24.79 / 24.84, RTX 4090 24GB 54.67 / 54.77 / 55.01;
# RTX 5090 and RTX PRO 6000 Workstation on bare metal)

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("v100-sxm2", "volta", 70, 80, 32 * GiB, 900 * GB, 125 * _T, None, 6, 3,
        "NVIDIA V100 datasheet (125 TFLOPS tensor, 900 GB/s, 6 NVLink2, 300 W); plain matmul: "
        "mli/transformers-benchmarks README, FP16 MatMul 95 TFLOPS", plain_matmul_flops=95 * _T,
        fp32_matmul_flops=14.38 * _T,
        fp32_flops=15.7 * _T, tdp_w=300),  # V100 datasheet: FP32 15.7 TFLOPS (SXM2)
    GPU("rtx2080ti", "turing", 75, 68, 11 * GiB, 616 * GB, 53.8 * _T, None, 2, 3,
        "Turing whitepaper (FP16 tensor FP32-acc 53.8 TFLOPS, 616 GB/s, 250 W)", 1199,
        line="geforce",
        fp32_matmul_flops=11.52 * _T,
        fp32_flops=13.4 * _T, tdp_w=250),  # Turing whitepaper: FP32 13.4 TFLOPS
    # Tesla T4 (Colab's and Kaggle's GPU): under its 70 W cap a continuous GEMM runs at the
    # clocks the power controller settles on, ~24 TFLOPS fp16 at 4096^3 over 100 iterations
    # (NVIDIA developer forum "About GPU peak performance", 2023-08: "arising due to power
    # capping ... expected behavior"), where a short benchmark reaches 41.9-42.7 (zzc0721
    # database.md: Colab, Kaggle): a training step runs for seconds, at the sustained rate.
    # 15 GiB: nvidia-smi's 15360 MiB with ECC on, as the clouds run it.
    GPU("t4", "turing", 75, 40, 15 * GiB, 320 * GB, 65 * _T, None, 0, 3,
        "NVIDIA T4 datasheet (FP16/FP32 mixed precision 65 TFLOPS, 16 GB GDDR6, 320 GB/s, "
        "70 W, PCIe Gen3 x16, no NVLink); plain matmul: NVIDIA developer forum, 24 TFLOPS "
        "sustained under the power cap", plain_matmul_flops=24 * _T,
        fp32_matmul_flops=4.3 * _T,  # database.md: 4.17 (Colab), 4.43 (Kaggle)
        fp32_flops=8.1 * _T, tdp_w=70),  # T4 datasheet: FP32 8.1 TFLOPS
    GPU("rtx3090", "ampere", 86, 82, 24 * GiB, 936 * GB, 71 * _T, None, 4, 4,
        "GA102 whitepaper (FP16/BF16 tensor FP32-acc 71 TFLOPS dense, 936 GB/s, 350 W)", 1499,
        line="geforce",
        fp32_matmul_flops=24.79 * _T,
        fp32_flops=35.6 * _T, tdp_w=350),  # GA102 whitepaper: FP32 35.6 TFLOPS
    GPU("rtx3090ti", "ampere", 86, 84, 24 * GiB, 1008 * GB, 80 * _T, None, 4, 4,
        "NVIDIA RTX 3090 Ti spec (FP32-acc tensor 80 TFLOPS dense = half of 160, 1008 GB/s, "
        "450 W); plain matmul: mli/transformers-benchmarks README, FP16 MatMul 81 TFLOPS",
        1999, plain_matmul_flops=81 * _T, line="geforce",
        fp32_flops=40 * _T, tdp_w=450),  # RTX 3090 Ti spec: FP32 40 TFLOPS
    GPU("rtx4090", "ada", 89, 128, 24 * GiB, 1008 * GB, 165.2 * _T, 167 * _T, 0, 4,
        "Ada whitepaper (165.2 TFLOPS FP32-acc dense, 1008 GB/s, 450 W); MAMF: stas00; plain "
        "matmul: mli/transformers-benchmarks issue 4 (fp16, n = 8192: 158.6 TFLOPS)", 1599,
        plain_matmul_flops=158.6 * _T, line="geforce",
        fp32_matmul_flops=54.77 * _T,
        fp32_flops=82.6 * _T, tdp_w=450),  # Ada whitepaper: FP32 82.6 TFLOPS
    GPU("rtx5090", "blackwell", 120, 170, 32 * GiB, 1792 * GB, 209.5 * _T, None, 0, 5,
        "Blackwell GeForce whitepaper (1792 GB/s, 575 W); 209.5 TFLOPS FP32-acc derived as half "
        "the FP16-acc rate (measurements.yaml gpus); plain matmul: zzc0721/torch-performance-"
        "test-data PR 15 (bf16 8192, PyTorch 2.8: 236 TFLOPS, the card boosts above its spec "
        "clock)", 1999, plain_matmul_flops=236 * _T, line="geforce",
        fp32_matmul_flops=67.57 * _T,
        fp32_flops=104.8 * _T, tdp_w=575),  # Blackwell GeForce whitepaper: FP32 104.8 TFLOPS
    GPU("a100-sxm4-80gb", "ampere", 80, 108, 80 * GiB, 2039 * GB, 312 * _T, 271.2 * _T, 12, 4,
        "A100 datasheet (312 TFLOPS, 2039 GB/s, 12 NVLink3, 400 W); MAMF: stas00; plain matmul: "
        "mli/transformers-benchmarks README, FP16 MatMul 230 TFLOPS", 15000,
        plain_matmul_flops=230 * _T,
        fp32_matmul_flops=19.18 * _T,
        fp32_flops=19.5 * _T, tdp_w=400),  # A100 datasheet: FP32 19.5 TFLOPS
    GPU("a100-pcie-80gb", "ampere", 80, 108, 80 * GiB, 1935 * GB, 312 * _T, 252.9 * _T, 12, 4,
        "A100 datasheet (312 TFLOPS, 1935 GB/s, 300 W); MAMF: stas00; plain matmul: "
        "mli/transformers-benchmarks issue 4 (A800 80GB PCIe, the same card with less NVLink: "
        "fp16 n = 8192, 215.3 TFLOPS)", 15000, plain_matmul_flops=215.3 * _T,
        fp32_flops=19.5 * _T, tdp_w=300),  # A100 datasheet: FP32 19.5 TFLOPS
    # The 40GB A100s: the same GA100 die, SMs, clocks and tensor peak as the 80GB cards, with
    # 40 GB of HBM2 at 1,555 GB/s (A100 datasheet); no GEMM sweep of them is published, so their
    # achieved GEMM rates are assumed those of the 80GB card of the same form (the 250 W PCIe
    # card may sustain less than the 300 W one measured).
    GPU("a100-sxm4-40gb", "ampere", 80, 108, 40 * GiB, 1555 * GB, 312 * _T, 271.2 * _T, 12, 4,
        "A100 datasheet (40GB SXM: 312 TFLOPS, 1555 GB/s HBM2, 12 NVLink3, 400 W); GEMM rates "
        "assumed as a100-sxm4-80gb's", 10000, plain_matmul_flops=230 * _T,
        fp32_flops=19.5 * _T, tdp_w=400),  # A100 datasheet: FP32 19.5 TFLOPS
    GPU("a100-pcie-40gb", "ampere", 80, 108, 40 * GiB, 1555 * GB, 312 * _T, 252.9 * _T, 12, 4,
        "A100 datasheet (40GB PCIe: 312 TFLOPS, 1555 GB/s HBM2, 250 W, NVLink bridge 600 GB/s); "
        "GEMM rates assumed as a100-pcie-80gb's", 8000, plain_matmul_flops=215.3 * _T,
        fp32_flops=19.5 * _T, tdp_w=250),  # A100 datasheet: FP32 19.5 TFLOPS
    GPU("h100-sxm", "hopper", 90, 132, 80 * GiB, 3350 * GB, 989 * _T, 794.5 * _T, 18, 5,
        "H100 datasheet (989 TFLOPS dense BF16, 3.35 TB/s, 18 NVLink4, 700 W); MAMF: stas00; "
        "plain matmul: zzc0721/torch-performance-test-data issue 79 (bf16 8192, PyTorch 2.7: "
        "797.5 TFLOPS)", 30000, plain_matmul_flops=797.5 * _T,
        fp32_matmul_flops=52.11 * _T, sustained_clock_share=GH100_SUSTAINED_SHARE,
        fp32_flops=67 * _T, tdp_w=700),  # H100 datasheet: FP32 67 TFLOPS
    GPU("h100-pcie", "hopper", 90, 114, 80 * GiB, 2000 * GB, 756 * _T, None, 12, 5,
        "H100 PCIe datasheet (756 TFLOPS dense BF16, 2.0 TB/s, 350 W); H100 PCIe product brief "
        "PB-11133-001 (NVLink bridge between two cards, 600 GB/s bidirectional = 12 NVLink4 "
        "links)", 25000,
        fp32_flops=51 * _T, tdp_w=350),  # H100 PCIe datasheet: FP32 51 TFLOPS
    GPU("h100-nvl", "hopper", 90, 132, 94 * GiB, 3900 * GB, 835 * _T, None, 12, 5,
        "H100 NVL product brief (94 GB HBM3, 3.9 TB/s, 835 TFLOPS dense BF16 = half of 1671 "
        "with sparsity, 350-400 W, NVLink bridge 600 GB/s = 12 links)", 30000,
        fp32_flops=60 * _T, tdp_w=400),  # H100 NVL product brief: FP32 60 TFLOPS
    GPU("h200", "hopper", 90, 132, 141 * 10**9, 4800 * GB, 989 * _T, 794.5 * _T, 18, 5,
        "H200 datasheet (141 GB, 4.8 TB/s, 989 TFLOPS dense BF16, 700 W); plain matmul as H100 "
        "SXM (same die, clocks and power limit)", 32000, plain_matmul_flops=797.5 * _T,
        fp32_matmul_flops=51.34 * _T, sustained_clock_share=GH100_SUSTAINED_SHARE,
        fp32_flops=67 * _T, tdp_w=700),  # H200 datasheet: FP32 67 TFLOPS
    GPU("b200", "blackwell", 100, 148, 180 * GiB, 8000 * GB, 2250 * _T, None, 18, 6,
        "NVIDIA HGX B200 datasheet (180 GB HBM3e per GPU in DGX B200, 8 TB/s, FP16/BF16 "
        "4.5 PFLOPS with sparsity = 2.25 dense, 1000 W, NVLink5 1.8 TB/s = 18 links)", 40000,
        fp32_matmul_flops=66.24 * _T,
        fp32_flops=80 * _T, tdp_w=1000),  # HGX B200 datasheet: FP32 80 TFLOPS
    GPU("l40s", "ada", 89, 142, 48 * GiB, 864 * GB, 362.05 * _T, None, 0, 4,
        "NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, BF16 tensor 362.05 TFLOPS dense = half "
        "of 733 with sparsity, 350 W, no NVLink)", 9000,
        fp32_matmul_flops=46.88 * _T,
        fp32_flops=91.6 * _T, tdp_w=350),  # L40S datasheet: FP32 91.6 TFLOPS
    GPU("rtx6000-ada", "ada", 89, 142, 48 * GiB, 960 * GB, 364.2 * _T, None, 0, 4,
        "NVIDIA RTX 6000 Ada datasheet (48 GB GDDR6, 960 GB/s, 1457 FP8 TFLOPS with sparsity "
        "= 364.2 dense FP16, 300 W, no NVLink)", 6800,
        fp32_flops=91.1 * _T, tdp_w=300),  # RTX 6000 Ada datasheet: FP32 91.1 TFLOPS
    GPU("rtx-pro-6000", "blackwell", 120, 188, 96 * GiB, 1792 * GB, 503.8 * _T, None, 0, 5,
        "NVIDIA RTX PRO 6000 Blackwell datasheet (96 GB GDDR7, 1792 GB/s, 4000 AI TOPS FP4 "
        "with sparsity = 503.8 dense FP16, 600 W Workstation Edition, no NVLink)", 8500,
        fp32_matmul_flops=77.24 * _T,
        fp32_flops=125 * _T, tdp_w=600),  # RTX PRO 6000 datasheet: FP32 125 TFLOPS
    GPU("rtx-a6000", "ampere", 86, 84, 48 * GiB, 768 * GB, 154.8 * _T, None, 4, 4,
        "NVIDIA RTX A6000 datasheet (48 GB GDDR6, 768 GB/s, 309.7 tensor TFLOPS with sparsity "
        "= 154.8 dense, 300 W, 2-way NVLink bridge 112.5 GB/s: link model ampere-ga102)", 4650,
        fp32_matmul_flops=23.92 * _T,
        fp32_flops=38.7 * _T, tdp_w=300),  # RTX A6000 datasheet: FP32 38.7 TFLOPS
    GPU("a40", "ampere", 86, 84, 48 * GiB, 696 * GB, 149.7 * _T, None, 4, 4,
        "NVIDIA A40 datasheet (48 GB GDDR6, 696 GB/s, BF16 tensor 149.7 TFLOPS dense = half of "
        "299.4 with sparsity, 300 W, PCIe Gen4 x16, 2-way NVLink bridge 112.5 GB/s: link model "
        "ampere-ga102)",
        fp32_flops=37.4 * _T, tdp_w=300),  # A40 datasheet: FP32 37.4 TFLOPS
    GPU("rtx-a5000", "ampere", 86, 64, 24 * GiB, 768 * GB, 111.1 * _T, None, 4, 4,
        "NVIDIA RTX A5000 datasheet (24 GB GDDR6, 768 GB/s, 222.2 tensor TFLOPS with sparsity "
        "= 111.1 dense, 230 W, PCIe Gen4 x16, 2-way NVLink bridge 112.5 GB/s: link model "
        "ampere-ga102)", 2250,
        fp32_flops=27.8 * _T, tdp_w=230),  # RTX A5000 datasheet: FP32 27.8 TFLOPS
    GPU("rtx-a4000", "ampere", 86, 48, 16 * GiB, 448 * GB, 76.7 * _T, None, 0, 4,
        "NVIDIA RTX A4000 datasheet (16 GB GDDR6, 448 GB/s, 153.4 tensor TFLOPS with sparsity "
        "= 76.7 dense, 140 W, PCIe Gen4 x16, no NVLink)", 1000,
        fp32_flops=19.2 * _T, tdp_w=140),  # RTX A4000 datasheet: FP32 19.2 TFLOPS
    GPU("l4", "ada", 89, 58, 24 * GiB, 300 * GB, 121 * _T, None, 0, 4,
        "NVIDIA L4 datasheet (24 GB GDDR6, 300 GB/s, BF16 tensor 242 TFLOPS with sparsity = "
        "121 dense, 72 W, PCIe Gen4 x16, no NVLink)",
        fp32_flops=30.3 * _T, tdp_w=72),  # L4 datasheet: FP32 30.3 TFLOPS
)}


# Where each card price comes from, and when. GeForce: NVIDIA's launch MSRP (Founders Edition
# where it differed). Data-centre parts have no public list price: order-of-magnitude street
# prices of the time, good to perhaps +-30%.
PRICE_SOURCES: dict[str, str] = {
    "rtx2080ti": "NVIDIA launch price, Founders Edition, 2018-09-20",
    "rtx3090": "NVIDIA launch MSRP, 2020-09-24",
    "rtx3090ti": "NVIDIA launch MSRP, 2022-03-29",
    "rtx4090": "NVIDIA launch MSRP, 2022-10-12",
    "rtx5090": "NVIDIA launch MSRP, 2025-01-30",
    "a100-sxm4-80gb": "street price order of magnitude, 2023 (no public list price)",
    "a100-pcie-80gb": "street price order of magnitude, 2023 (no public list price)",
    "a100-sxm4-40gb": "street price order of magnitude, 2023 (no public list price)",
    "a100-pcie-40gb": "street price order of magnitude, 2023 (no public list price)",
    "h100-sxm": "street price order of magnitude, 2024 (no public list price)",
    "h100-pcie": "street price order of magnitude, 2024 (no public list price)",
    "h200": "street price order of magnitude, 2024 (no public list price)",
    "h100-nvl": "street price order of magnitude, 2024 (no public list price)",
    "b200": "street price order of magnitude, 2025 (no public list price)",
    "l40s": "street price order of magnitude, 2024 (no public list price)",
    "rtx6000-ada": "NVIDIA list price at launch, about $6,800, 2022-12",
    "rtx-pro-6000": "retail price at launch, about $8,500, 2025-04 (Workstation Edition)",
    "rtx-a6000": "NVIDIA list price at launch, $4,650, 2020-10",
    "rtx-a5000": "NVIDIA list price at launch, $2,250, 2021-04",
    "rtx-a4000": "NVIDIA list price at launch, $1,000, 2021-04",
}

# The names CUDA and nvidia-smi give each card (nvidia-smi -L, nccl-tests' `Using devices`),
# lower case, longest first so "rtx 3090 ti" is not read as "rtx 3090"; the value is a catalog
# name, with the memory in GiB where the card is a smaller-memory variant of that entry.
DEVICE_NAMES: tuple[tuple[str, str, float | None], ...] = (
    ("geforce rtx 2080 ti", "rtx2080ti", None), ("geforce rtx 3090 ti", "rtx3090ti", None),
    ("geforce rtx 3090", "rtx3090", None), ("geforce rtx 4090", "rtx4090", None),
    ("geforce rtx 5090", "rtx5090", None), ("rtx pro 6000 blackwell", "rtx-pro-6000", None),
    ("rtx 6000 ada", "rtx6000-ada", None), ("rtx a6000", "rtx-a6000", None),
    ("rtx a5000", "rtx-a5000", None), ("rtx a4000", "rtx-a4000", None),
    ("a100-sxm4-80gb", "a100-sxm4-80gb", None), ("a100-sxm4-40gb", "a100-sxm4-40gb", None),
    ("a100 80gb pcie", "a100-pcie-80gb", None), ("a100-pcie-40gb", "a100-pcie-40gb", None),
    ("a800 80gb pcie", "a100-pcie-80gb", None), ("h100 80gb hbm3", "h100-sxm", None),
    ("h100 pcie", "h100-pcie", None), ("h100 nvl", "h100-nvl", None), ("h200", "h200", None),
    ("b200", "b200", None), ("l40s", "l40s", None), ("a40", "a40", None), ("l4", "l4", None),
    ("v100-sxm2-16gb", "v100-sxm2", 16), ("v100-sxm2", "v100-sxm2", None), ("t4", "t4", None),
)


def from_device_name(name: str) -> tuple[str, float | None] | None:
    """The catalog entry (and a smaller memory in GiB, if any) of a device name as CUDA prints
    it ("NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-40GB"); None if the catalog has no such
    card."""
    text = " ".join(name.lower().replace("nvidia", " ").replace("tesla", " ").split())
    for pattern, catalog, memory in DEVICE_NAMES:
        rest = text[len(pattern):]
        if text.startswith(pattern) and not rest[:1].isalnum():
            return catalog, memory
    return None


# The share of the spec FP32 rate an fp32 GEMM reaches, by compute capability: the median over
# the catalog's cards of that generation whose fp32 GEMM is measured (an SM with a second FP32
# path, sm86 / sm89 / sm120, reaches 0.5-0.7; the others 0.77-0.98)
FP32_GEMM_SHARE: dict[int, float] = {
    cc: median([g.fp32_matmul_flops / g.fp32_flops for g in GPUS.values()
                if g.compute_capability == cc and g.fp32_matmul_flops and g.fp32_flops])
    for cc in {g.compute_capability for g in GPUS.values() if g.fp32_matmul_flops}}


# Achievable share of the spec HBM bandwidth for streaming kernels: STREAM-like copy kernels
# reach about 85-90% of spec on A100/H100 (BabelStream published results); 0.85 is the low end.
MEMORY_EFFICIENCY = 0.85


def achievable_memory_bandwidth(card: GPU) -> float:
    """What streaming kernels (and NCCL's copies) get of the card's memory, B/s."""
    return card.memory_bandwidth * MEMORY_EFFICIENCY


def gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise InputError(f"unknown GPU {quoted(name)}; catalog: "
                         f"{', '.join(sorted(GPUS))}") from None
