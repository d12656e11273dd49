"""The software stack a run used, and the achieved rates that depend on it.

A run names its stack as ``training.software`` (``{torch: "2.1", cuda: "12.1"}``, or a year such
as ``2023`` that stands for the stack published runs of that year used) or ``--software``;
without one it runs today's: the newest row of every table below. What depends on the stack:

- GEMMs: cuBLAS ships new kernels with each CUDA release. The catalog's plain GEMM rates
  (catalog/gpus.py) were measured on 2025 builds; ``GEMM_ROWS`` gives, per architecture, the
  share of that rate older CUDA generations reach, each row from a dated measurement. Only
  Hopper's rows differ: its first cuBLAS generations left a quarter to a tenth of the tensor
  cores idle at training shapes, while Ampere's kernels have not moved since CUDA 11.
- Attention kernels (``training.attention``): PyTorch's ``scaled_dot_product_attention``
  runs FlashAttention-1 kernels before 2.2 and FlashAttention-2 from 2.2 on;
  FlashAttention-3 needs CUDA 12.3. compute.py times each kernel it resolves to.
- What a framework bundle selects (job/recipe.py): transformers uses SDPA only on
  torch >= 2.1.1, llm-foundry's benchmark configs ran its Triton attention until v0.7.0.
- Which cards a stack can drive at all: a CUDA release older than an architecture has no
  kernels for it (an RTX 5090 needs CUDA 12.8).
- What transformers returns (``transformers``): a Llama-family model's logits in fp32 before
  4.46, in the compute dtype from 4.46 (memory/activations.py, when the loop keeps them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from simulator.errors import InputError

Version = tuple[int, int, int]


def parse_version(text: str, what: str) -> Version:
    """``"2.1"`` -> (2, 1, 0); ``"2.1.1+cu121"`` -> (2, 1, 1)."""
    found = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[+a-z].*)?", str(text).strip())
    if found is None:
        raise InputError(f"{what} version {text!r}: expected MAJOR.MINOR, e.g. 2.1",
                         key=f"training.software.{what}")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def _words(v: Version) -> str:
    return f"{v[0]}.{v[1]}" + (f".{v[2]}" if v[2] else "")


@dataclass(frozen=True)
class Stack:
    """One software stack: PyTorch and CUDA versions, and how the run named it."""

    torch: Version
    cuda: Version
    given: str  # "today", "2023", "torch 2.1, CUDA 12.1", "torch 2.2, transformers 4.38"
    transformers_given: Version | None = None  # as the run named it; see ``transformers``

    @property
    def transformers(self) -> Version:
        """The transformers release: as given, else one of its PyTorch's time (see
        LOSS_FUNCTION)."""
        if self.transformers_given is not None:
            return self.transformers_given
        if self.torch >= TODAY.torch:  # today's stack, or a later one
            return TODAY_TRANSFORMERS
        known = [v for v in TRANSFORMERS_AT_TORCH if v <= self.torch[:2]]
        return TRANSFORMERS_AT_TORCH[max(known)] if known else min(TRANSFORMERS_AT_TORCH.values())

    def words(self) -> str:
        if self.given == "today":
            return (f"today's (the newest rate rows: PyTorch {_words(self.torch)}, "
                    f"CUDA {_words(self.cuda)})")
        return f"{self.given}: PyTorch {_words(self.torch)}, CUDA {_words(self.cuda)}"

    def to_json(self) -> dict[str, Any]:
        return {"given": self.given, "torch": _words(self.torch), "cuda": _words(self.cuda),
                "transformers": _words(self.transformers)}


# transformers' Llama-family models upcast the logits in the model's forward before 4.46
# (LlamaForCausalLM.forward, 4.36-4.45: ``logits = logits.float()`` ahead of the loss) and return
# them in fp32; 4.46 (2024-10-24) moved the upcast into the loss function
# (src/transformers/loss/loss_utils.py ForCausalLMLoss: ``logits = logits.float()`` on a local),
# so the model returns them in the compute dtype.
LOSS_FUNCTION = (4, 46, 0)
TODAY_TRANSFORMERS = (4, 56, 0)
# The transformers release out when each PyTorch minor release came out (PyPI release dates:
# torch 1.10 2021-10-21, transformers 4.11 2021-09-27; 1.11 2022-03-10, 4.17 2022-03-03; 1.12
# 2022-06-28, 4.20 2022-06-16; 1.13 2022-10-28, 4.23 2022-10-10; 2.0 2023-03-15, 4.26
# 2023-01-24; 2.1 2023-10-04, 4.34 2023-10-03; 2.2 2024-01-30, 4.37 2024-01-22; 2.3 2024-04-24,
# 4.40 2024-04-18; 2.4 2024-07-24, 4.43 2024-07-23; 2.5 2024-10-17, 4.45 2024-09-25; 2.6
# 2025-01-29, 4.48 2025-01-10; 2.7 2025-04-23, 4.51 2025-04-05; 2.8 2025-08-06, 4.55
# 2025-08-05): a stack that names no transformers takes its PyTorch's.
TRANSFORMERS_AT_TORCH: dict[tuple[int, ...], Version] = {
    (1, 10): (4, 11, 0), (1, 11): (4, 17, 0), (1, 12): (4, 20, 0), (1, 13): (4, 23, 0),
    (2, 0): (4, 26, 0), (2, 1): (4, 34, 0), (2, 2): (4, 37, 0), (2, 3): (4, 40, 0),
    (2, 4): (4, 43, 0), (2, 5): (4, 45, 0), (2, 6): (4, 48, 0), (2, 7): (4, 51, 0),
    (2, 8): (4, 55, 0)}


# Today's stack: the catalog's newest rates were measured on PyTorch 2.7-2.8 with CUDA 12.6-12.8
# (catalog/gpus.py: the H100 plain GEMM on 2.7 + cu128, the RTX 5090's on 2.8); later releases
# are taken at those rates until a measurement says otherwise.
TODAY = Stack((2, 8, 0), (12, 8, 0), "today")

# The CUDA of each PyTorch release's default wheel on PyPI (`pip install torch==X`): cu102 up to
# 1.12, cu117 for 1.13 and 2.0, cu121 for 2.1-2.4, cu124 for 2.5-2.6, cu126 for 2.7, cu128 for
# 2.8 (pytorch.org "Previous PyTorch Versions", the wheels' nvidia-*-cu1x requirements).
DEFAULT_CUDA: dict[tuple[int, int], Version] = {
    **{(1, m): (10, 2, 0) for m in range(5, 13)}, (1, 13): (11, 7, 0), (2, 0): (11, 7, 0),
    **{(2, m): (12, 1, 0) for m in range(1, 5)}, (2, 5): (12, 4, 0), (2, 6): (12, 4, 0),
    (2, 7): (12, 6, 0), (2, 8): (12, 8, 0)}

# A year stands for the stack published runs of that year most often name. PyTorch's release
# dates: 1.0 2018-12-07, 1.3 2019-10-10, 1.7 2020-10-27 (first with CUDA 11.0 wheels), 1.10
# 2021-10-21, 1.13 2022-10-28, 2.0 2023-03-15, 2.4 2024-07-24, 2.7 2025-04-23.
# 2022: NVIDIA's NGC 22.x containers (PyTorch 1.13.0a0, CUDA 11.7; mli/transformers-benchmarks'
# runs print exactly that); 2023: torch 2.0 with its CUDA 11.8 wheel, the first to build for
# Hopper (sm_90) and what H100 boxes of that year ran; 2024: torch 2.4's default cu121 wheel;
# 2025: torch 2.7's cu126. A later year is today's stack.
YEARS: dict[int, tuple[Version, Version]] = {
    2018: ((1, 0, 0), (10, 0, 0)), 2019: ((1, 3, 0), (10, 1, 0)),
    2020: ((1, 7, 0), (11, 0, 0)), 2021: ((1, 10, 0), (11, 3, 0)),
    2022: ((1, 13, 0), (11, 7, 0)), 2023: ((2, 0, 0), (11, 8, 0)),
    2024: ((2, 4, 0), (12, 1, 0)), 2025: ((2, 7, 0), (12, 6, 0)),
}


def resolve(value: Any) -> Stack:
    """The stack a ``training.software`` value names: None (today's), a year, or a mapping
    with ``torch`` and optionally ``cuda`` (else that release's default wheel's)."""
    if value is None:
        return TODAY
    if isinstance(value, int) and not isinstance(value, bool):
        if value > max(YEARS):
            return Stack(TODAY.torch, TODAY.cuda, str(value))
        if value not in YEARS:
            raise InputError(f"software year {value}: the tables start at {min(YEARS)}",
                             key="training.software")
        torch, cuda = YEARS[value]
        return Stack(torch, cuda, str(value))
    torch_text = getattr(value, "torch", None)
    cuda_text = getattr(value, "cuda", None)
    hf_text = getattr(value, "transformers", None)
    if isinstance(value, dict):
        torch_text, cuda_text = value.get("torch"), value.get("cuda")
        hf_text = value.get("transformers")
    if torch_text is None:
        raise InputError("software: give a year or {torch: MAJOR.MINOR, cuda: MAJOR.MINOR}",
                         key="training.software")
    torch = parse_version(torch_text, "torch")
    if cuda_text is None:
        default = DEFAULT_CUDA.get((torch[0], torch[1]),
                                   TODAY.cuda if torch >= TODAY.torch else None)
        if default is None:
            raise InputError(f"software: torch {_words(torch)} has no default CUDA in the "
                             "table; give cuda too", key="training.software.cuda")
        cuda = default
    else:
        cuda = parse_version(cuda_text, "cuda")
    hf = None if hf_text is None else parse_version(hf_text, "transformers")
    given = (f"torch {_words(torch)}" + (f", CUDA {_words(cuda)}" if cuda_text else "")
             + (f", transformers {_words(hf)}" if hf else ""))
    return Stack(torch, cuda, given, hf)


def parse_flag(text: str) -> int | dict[str, str]:
    """``--software 2023`` or ``--software torch=2.1,cuda=12.1[,transformers=4.38]`` as a
    training value."""
    text = text.strip()
    try:  # checked here, so an error names the flag, not the workload it overrides
        flag = int(text) if text.isdigit() else _parse_versions(text)
        resolve(flag)
    except InputError as exc:
        raise InputError(f"--software {text!r}: {exc.message}") from None
    return flag


def _parse_versions(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in ("torch", "cuda", "transformers") or not value.strip():
            raise InputError("expected a year (2023) or torch=2.1,cuda=12.1,transformers=4.38")
        if key.strip() in out:
            raise InputError(f"{key.strip()} is given twice; give it once")
        out[key.strip()] = value.strip()
        parse_version(value, key.strip())
    if "torch" not in out:
        raise InputError("give torch=MAJOR.MINOR (and cuda=...)")
    return out


# ---- GEMMs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of a rate table: from which CUDA (or PyTorch) version it holds, the share of
    the catalog's rate it gives, and the measurement behind it."""

    since: Version
    share: float
    label: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"row": self.label, "share": round(self.share, 4), "source": self.source}


# Hopper, H100 SXM bf16 plain GEMMs at training shapes ((b x 2048) x 8192 by 8192 x 8192):
_H100_TODAY = 797.5  # catalog/gpus.py: zzc0721/torch-performance-test-data issue 79 (2025-10-18)
GEMM_ROWS: dict[str, tuple[Row, ...]] = {
    "hopper": (
        Row((11, 8, 0), 720.0 / _H100_TODAY, "CUDA 11.8 (cuBLAS 11.11)",
            "pytorch/pytorch issue 100850, 2023-05-10: cuBLAS 11.11.3.6, 720.3 / 639 / 772 "
            "TFLOPS at b = 1 / 2 / 4: the median, 720 (spread 0.80-0.97 of today's)"),
        Row((12, 0, 0), 549.5 / _H100_TODAY, "CUDA 12.0 (cuBLAS 12.0)",
            "pytorch/pytorch issue 100850, 2023-05-08: cuBLAS 12.0.2, 742.7 / 549.5 / 542.9 "
            "TFLOPS at b = 1 / 2 / 4 (NGC bignlp container): the median, 549.5 (spread "
            "0.68-0.93 of today's)"),
        Row((12, 1, 0), 1.0, "CUDA 12.1 and later",
            "stas00/ml-engineering MAMF table: 792.1 TFLOPS on CUDA 12.1 against 794.5 on "
            "PyTorch 2.7 + CUDA 12.6 (within 0.3%): the catalog's 797.5 (PyTorch 2.7, CUDA "
            "12.8)"),
    ),
}
# Every other architecture: one row. A100's best GEMM moved 1.2% between CUDA 12.1 (MAMF
# 267.9) and 12.6 (271.2) in stas00's tables, and its plain 8192^3 GEMM measured 230 TFLOPS
# with CUDA 11.x in 2022 (mli/transformers-benchmarks) as the catalog has it; the GeForce rates
# were measured on the stacks their cards need.
_ONE_ROW = Row((0, 0, 0), 1.0, "every generation",
               "no generation dependence measured (A100: MAMF 267.9 TFLOPS on CUDA 12.1, "
               "271.2 on 12.6, stas00/ml-engineering)")

# The oldest CUDA with kernels for each architecture (CUDA release notes: sm_80 in 11.0, sm_86
# in 11.1, sm_89 and sm_90 in 11.8, sm_100 and sm_120 in 12.8).
MIN_CUDA: dict[tuple[str, int], Version] = {
    ("ampere", 80): (11, 0, 0), ("ampere", 86): (11, 1, 0), ("ada", 89): (11, 8, 0),
    ("hopper", 90): (11, 8, 0), ("blackwell", 100): (12, 8, 0), ("blackwell", 120): (12, 8, 0)}


def gemm_row(arch: str, stack: Stack) -> Row:
    """The GEMM row an architecture runs at under a stack (the newest one not after it)."""
    rows = GEMM_ROWS.get(arch)
    if not rows:
        return _ONE_ROW
    usable = [r for r in rows if r.since <= stack.cuda]
    return usable[-1] if usable else rows[0]


def check_card(name: str, arch: str, capability: int, stack: Stack) -> None:
    """Refuse a stack whose CUDA has no kernels for the card."""
    need = MIN_CUDA.get((arch, capability))
    if need is not None and stack.cuda < need:
        raise InputError(f"{name} ({arch}, sm_{capability}) needs CUDA {_words(need)} or later; "
                         f"the software stack has CUDA {_words(stack.cuda)}",
                         key="training.software")


# ---- attention ---------------------------------------------------------------------------

# FlashAttention-2 is "about 2x faster" than FlashAttention-1 (Dao 2023, arXiv:2307.08691,
# abstract; 1.7-3.0x in its section 4.1), and PyTorch 2.2's release notes (2024-01-30) say
# SDPA's move to FlashAttention-2 yields "around 2x speedups compared to previous versions".
FLASH1_SLOWDOWN = 2.0
SDPA_FA2 = (2, 2, 0)  # PyTorch 2.2: SDPA's flash backend becomes FlashAttention-2
FLASH3_CUDA = (12, 3, 0)  # flash-attention hopper/setup.py: FlashAttention-3 needs CUDA >= 12.3
# The GPUs the flash kernels run on (compute capability, 75 = sm75): flash-attn 2 and 3 need
# Ampere or newer (Dao-AILab/flash-attention README: "Ampere, Ada, or Hopper GPUs"), flash-attn
# 1.x Turing or newer ("Turing or Ampere GPUs"); sdpa's flash kernel took [sm75, sm90] while it
# was FlashAttention-1 (PyTorch 2.0-2.1 sdp_utils.cpp check_gpu_sm75_or_greater) and [sm80,
# sm121] since it is FlashAttention-2 (check_flash_attention_hardware_support); below that sdpa
# runs its memory-efficient kernel ([sm50, ...]: check_mem_efficient_hardware_support).
FLASH2_MIN_SM, FLASH1_MIN_SM = 80, 75
HOPPER_SM = 90
# the attention implementations that take gpt-oss's per-head sinks: transformers' eager one, and
# the sink-aware FlashAttention-3 of kernels-community/vllm-flash-attn3
SINK_KERNELS = ("eager", "flash3")
# The implementations that take 16-bit inputs only: the flash-attn package's kernels (csrc
# flash_api.cpp mha_fwd "FlashAttention only support fp16 and bf16 data type"; its Triton kernel,
# flash_attn_triton.py, asserts the same) and sdpa's flash backend (sdp_utils.cpp
# check_flash_attention's dtypes: half, bfloat16). sdpa's memory-efficient backend also takes
# fp32, on every GPU (less_than_sm80_ and greater_than_or_equal_sm80_mem_efficient_dtypes).
FLASH_ATTN = ("flash", "flash1", "flash2", "flash3")  # the flash-attn package's CUDA kernels
HALF_ONLY = (*FLASH_ATTN, "triton")
HF_SDPA = (2, 1, 1)  # transformers utils/import_utils.py is_torch_sdpa_available: torch>=2.1.1
FOUNDRY_NO_TRITON = (2, 2, 0)  # llm-foundry v0.7.0 (2024-03-26, torch>=2.2.1) removed triton
# The first transformers release whose model class takes attn_implementation="sdpa" (its
# ``_supports_sdpa = True``, the default where it is): Llama 4.36.0 (Mistral and Qwen2 4.37),
# BERT 4.41.0, GPT-2 4.42.0, read in each release's models/<model>/modeling_<model>.py; before
# it the class runs eager attention. MPT's transformers class never took it (4.43: no
# _supports_sdpa).
HF_SDPA_SINCE: dict[str, Version] = {"llama": (4, 36, 0), "bert": (4, 41, 0),
                                     "gpt2": (4, 42, 0)}


def hf_sdpa(stack: Stack, family: str | None) -> bool:
    """transformers runs a ``family`` model's attention through sdpa by default on ``stack``
    (None: a model whose family is not known takes Llama's release). A stack that names no
    transformers release is taken to run one that offers sdpa wherever its torch does
    (transformers' own check): most runs on a torch came after the release of its day
    (TRANSFORMERS_AT_TORCH), so that release would make them eager too often."""
    if stack.torch < HF_SDPA:
        return False
    if stack.transformers_given is None:
        return True
    since = HF_SDPA_SINCE.get(family or "llama")
    return since is not None and stack.transformers_given >= since


def check_hf_sdpa(impl: str, stack: Stack, family: str | None) -> None:
    """Refuse ``sdpa`` for a transformers class that does not take it on the named release:
    transformers raises there ("does not support an attention implementation through
    torch.nn.functional.scaled_dot_product_attention yet", modeling_utils.py)."""
    if impl != "sdpa" or stack.transformers_given is None or stack.torch < HF_SDPA \
            or hf_sdpa(stack, family):
        return
    since = HF_SDPA_SINCE.get(family or "llama")
    when, fix = ((f"it takes it from {_words(since)}", "attention eager or a later transformers")
                 if since else ("it never took it", "attention eager"))
    raise InputError(f"transformers {_words(stack.transformers_given)}'s {family or 'llama'} "
                     f"class has no sdpa ({when}: its modeling file's _supports_sdpa); "
                     f"give {fix}", key="training.attention")


# transformers 4.38 and 4.39 build the Llama and Gemma classes' 4D causal mask on every call
# (LlamaModel._update_causal_mask, their static-cache refactor) and give it to sdpa, whose flash
# kernel takes no mask, so sdpa runs its memory-efficient kernel over every query-key pair with
# or without padding: "SDPA can't dispatch to FA2 in case the attn_mask argument is not None,
# which was always the case in recent releases following llama/gemma refactor" (transformers
# PR 30070, released in 4.40). AnswerDotAI's fsdp_qlora met it as more memory (transformers
# issue 30010, "4.38 & 4.39 than 4.37 with identical code") and its README excluded both
# releases (fsdp_qlora 467933f, 2024-04-18). Mistral's and Qwen2's classes of those releases
# kept the older mask path (no mask without padding); stepsim's llama family covers them too,
# so one of them named with 4.38 or 4.39 runs the masked kernel here.
HF_CAUSAL_MASK_ALWAYS = ((4, 38, 0), (4, 40, 0))


def hf_masks_every_call(stack: Stack) -> bool:
    """transformers' Llama-family sdpa attention gets a mask tensor on every call under this
    stack (HF_CAUSAL_MASK_ALWAYS)."""
    low, high = HF_CAUSAL_MASK_ALWAYS
    return low <= stack.transformers < high


def attention_kernel(impl: str, stack: Stack, *, padded: bool = False,
                     fp32: bool = False) -> str:
    """The kernel an attention implementation runs under a stack: flash2, flash1, flash3,
    triton, mem_efficient or eager (``flash`` is FlashAttention-2, as ``flash2``; ``flash1``
    is flash-attn 1.x, named explicitly). ``padded``: the batches carry a padding mask, which
    sdpa's flash kernel does not take (torch/nn/attention sdp_utils check_for_attn_mask), so
    it runs the memory-efficient one (transformers builds the 4D mask whenever a batch has
    padding: modeling_attn_mask_utils.py _ignore_causal_mask_sdpa). ``fp32``: the attention's
    inputs are fp32 (fp32 training, no autocast), which no flash kernel takes (HALF_ONLY): sdpa
    runs its memory-efficient one, a flash-attn kernel is refused."""
    if fp32 and impl in HALF_ONLY:
        raise InputError(f"attention {impl} takes fp16 and bf16 only (flash-attn flash_api.cpp: "
                         "\"FlashAttention only support fp16 and bf16 data type\"); an fp32 "
                         "run takes attention sdpa (its memory-efficient kernel takes fp32) or "
                         "eager", key="training.attention")
    if impl in ("flash", "flash2"):
        return "flash2"
    if impl == "sdpa":
        if stack.torch < (2, 0, 0):
            raise InputError(f"attention sdpa needs PyTorch 2.0 or later (scaled_dot_product_"
                             f"attention); the stack has {_words(stack.torch)}",
                             key="training.attention")
        if padded or fp32:
            return "mem_efficient"
        return "flash2" if stack.torch >= SDPA_FA2 else "flash1"
    if impl == "flash3" and stack.cuda < FLASH3_CUDA:
        raise InputError(f"attention flash3 needs CUDA 12.3 or later (flash-attention "
                         f"hopper/setup.py); the stack has CUDA {_words(stack.cuda)}",
                         key="training.attention")
    return impl


def kernel_on_gpu(kernel: str, impl: str, compute_capability: int) -> str:
    """The kernel an attention implementation runs on a GPU: ``kernel`` (``attention_kernel``)
    where the GPU has it, else sdpa's memory-efficient fallback."""
    floor = FLASH1_MIN_SM if kernel == "flash1" else FLASH2_MIN_SM
    if impl == "sdpa" and kernel in ("flash1", "flash2") and compute_capability < floor:
        return "mem_efficient"
    return kernel


def attention_gpu_problem(impl: str, compute_capability: int, gpu: str, *,
                          sinks: bool = False) -> str | None:
    """Why an attention implementation cannot run on a GPU (None: it can): flash-attn below
    its GPUs; with ``sinks`` (gpt-oss's) anything but SINK_KERNELS, and flash3 off Hopper."""
    if sinks and impl not in SINK_KERNELS:
        return (f"attention {impl} takes no attention sinks: gpt-oss trains with eager "
                "attention (GptOssPreTrainedModel _supports_sdpa = False) or flash3 (a "
                "sink-aware FlashAttention-3 kernel, kernels-community/vllm-flash-attn3, on "
                "Hopper)")
    if sinks and impl == "flash3" and compute_capability != HOPPER_SM:
        return (f"attention flash3 with gpt-oss's sinks is the Hopper (sm{HOPPER_SM}) kernel of "
                f"kernels-community/vllm-flash-attn3; the {gpu} is sm{compute_capability}: "
                "attention eager runs there")
    floor = FLASH1_MIN_SM if impl == "flash1" else FLASH2_MIN_SM
    if impl in FLASH_ATTN and compute_capability < floor:
        return (f"attention {impl} (the flash-attn package) needs sm{floor} or newer "
                f"(flash-attention README); the {gpu} is sm{compute_capability}: attention sdpa "
                "runs there (its memory-efficient kernel)")
    return None


ATTENTION_SOURCES = {
    "flash2": "FlashAttention-2 shares of peak by architecture (compute.py FLASH_EFFICIENCY)",
    "flash1": "FlashAttention-1 (flash-attn 1.x, and SDPA before PyTorch 2.2): "
              "FlashAttention-2's rate / 2 (PyTorch 2.2 release notes; arXiv:2307.08691)",
    "flash3": "FlashAttention-3 on Hopper (flash-attention PR 1791 benchmark); FA2 elsewhere",
    "triton": "flash-attn's Triton kernel: FlashAttention-2's rate / 1.8 (arXiv:2307.08691 "
              "section 4.1: FA2 1.3-2.5x faster than FlashAttention in Triton)",
    "mem_efficient": "sdpa's memory-efficient (xformers CUTLASS) kernel, under a padding "
                     "mask or transformers 4.38-4.39's Llama mask (every query-key pair: "
                     "transformers PR 30070) or on a GPU below its flash kernel's: at "
                     "FlashAttention-1's rate (FA2's / 2) from Ampere on (forward 5% under FA1 "
                     "on A100, facebookresearch/xformers PR 362; about half of FA2 on A40, "
                     "xformers issue 1074); on Volta and Turing at their own assumed row "
                     "(compute.py FLASH_EFFICIENCY); given fp32 (fp32 training) 3.8x slower "
                     "from Ampere on (xformers PRs 467, 587, A100), at the CUDA cores' rate "
                     "before (compute.py fp32_attention_share)",
    "eager": "scores materialised: GEMMs and memory-bound passes (job/attention.py)",
}


def rows_used(stack: Stack, arch: str, kernel: str | None, *, own_gemm: bool = False,
              half_dtype_share: float = 1.0, hf_mask: bool = False) -> dict[str, Any]:
    """The table rows a run reads: its GEMM row and its attention kernel's (None: a model
    without attention), for the report; ``half_dtype_share`` below 1: bf16 on a card without
    bf16 tensor cores (gpus.py); ``hf_mask``: the kernel is sdpa's memory-efficient one
    because transformers masks every call (HF_CAUSAL_MASK_ALWAYS)."""
    gemm = ({"row": "the topology's own matmul_tflops", "share": 1.0,
             "source": "measured on this machine"} if own_gemm
            else {"arch": arch, **gemm_row(arch, stack).to_json()})
    if half_dtype_share < 1:
        gemm["bf16_on_cuda_cores"] = half_dtype_share
    return {"stack": stack.to_json(), "gemm": gemm,
            "attention": None if kernel is None else
            {"kernel": kernel, "source": ATTENTION_SOURCES.get(kernel, ""),
             **({"why": f"transformers {_words(stack.transformers)} gives Llama's sdpa a "
                        "mask on every call"} if hf_mask and kernel == "mem_efficient" else {})}}
