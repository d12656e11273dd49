"""The training recipe a job runs: kernels, loss, precision, optimizer, checkpointing.

``training.framework`` names a bundle that sets the defaults of the other recipe keys as that
framework ships them; keys the workload (or a command-line flag) gives explicitly override the
bundle. Besides the six keys a bundle fixes details no key exposes (how rotary embeddings are
written, which AdamW implementation runs, whether the loss is compiled, whether gradients are
clipped). ``training.optimizer_in_bwd`` (torchtune's key) belongs to no bundle: it is off
unless given, and when on there is no gradient clipping (torchtune refuses ``clip_grad_norm``
with it). Every bundle entry names its source:

- hf: transformers Trainer. Eager modules (``torch_compile=False``), ``attn_implementation``
  ``sdpa`` (``eager`` before torch 2.1.1 or before the model's class took sdpa:
  ``bundle_attention``), ``ForCausalLMLoss`` on ``logits.float()``, AMP bf16 (``bf16=True``),
  ``optim`` default ``adamw_torch_fused`` on torch >= 2.8 (training_args.py),
  ``gradient_checkpointing=False``, ``max_grad_norm=1.0``; rotary as modeling_llama.py
  ``rotate_half``.
- torchtune: recipes/configs (llama3_1/8B_full_single_device.yaml and the distributed ones):
  ``compile: False``, SDPA attention, ``CEWithChunkedOutputLoss``, ``dtype: bf16`` (weights,
  gradients and optimizer states all bf16), ``enable_activation_checkpointing: True``; the
  distributed configs' ``torch.optim.AdamW`` with ``fused: True`` (single-device configs ship
  ``PagedAdamW8bit`` with ``optimizer_in_bwd: True``: say ``optimizer: paged-adamw-8bit``,
  ``optimizer_in_bwd: true``); ``clip_grad_norm: null``; rotary as
  modules/position_embeddings.py (fp32 pairs); the loss compiled with the model.
- torchtitan: train_configs/llama3_8b.toml and config_manager.py at the 2024-12 benchmark commit
  9dec370: ``compile = false``, SDPA attention, loss ``cross_entropy(pred.float())`` never
  compiled (train.py), FSDP2 bf16 parameters with fp32 reduction, AdamW ``fused = False`` (so
  foreach), ``activation_checkpoint.mode = 'selective'`` with ``selective_ac_option = 'op'``,
  ``max_norm = 1.0``; rotary as models/llama/model.py (complex fp32).
- llm-foundry: scripts/train/benchmarking yamls: eager MPT with its Triton attention (flash-attn
  2 from llm-foundry v0.7.0, torch 2.2: ``bundle_attention``) and ``loss_fn:
  fused_crossentropy`` (flash-attn's), ``precision: amp_bf16``, Composer DecoupledAdamW (a per-
  tensor loop), no activation checkpointing, gradient clipping 1.0.
- megatron: Megatron-LM defaults with Transformer Engine: fused kernels, flash-attn 2, fp32
  vocab-parallel cross-entropy on ``logits.float()`` (tensor_parallel/cross_entropy.py), bf16
  with fp32 main parameters, FusedAdam (one multi-tensor kernel), no recompute unless asked,
  ``--clip-grad 1``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from simulator.catalog import software
from simulator.catalog.software import TODAY, Stack

if TYPE_CHECKING:
    from simulator.inputs.schema import TrainingConfig

FRAMEWORKS = ("hf", "torchtune", "torchtitan", "llm-foundry", "megatron")
KERNELS = ("eager", "compiled", "fused")
# the training keys a framework bundle sets, in the order a recipe is printed
KEYS = ("kernels", "attention", "cross_entropy", "precision", "optimizer",
        "activation_checkpointing")

_BUNDLES: dict[str, dict[str, Any]] = {
    "hf": {"kernels": "eager", "attention": "sdpa", "cross_entropy": "fp32",
           "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": "none",
           "rotary": "rotate_half", "optimizer_impl": "fused", "compile_loss": True,
           "clip_grad": True},
    "torchtune": {"kernels": "eager", "attention": "sdpa", "cross_entropy": "chunked",
                  "precision": "pure-bf16", "optimizer": "adamw",
                  "activation_checkpointing": "full", "rotary": "pairs",
                  "optimizer_impl": "fused", "compile_loss": True, "clip_grad": False},
    "torchtitan": {"kernels": "eager", "attention": "sdpa", "cross_entropy": "fp32",
                   "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": "op",
                   "rotary": "complex", "optimizer_impl": "foreach", "compile_loss": False,
                   "clip_grad": True},
    "llm-foundry": {"kernels": "eager", "attention": "flash2", "cross_entropy": "fused",
                    "precision": "bf16", "optimizer": "adamw",
                    "activation_checkpointing": "none", "rotary": "rotate_half",
                    "optimizer_impl": "loop", "compile_loss": True, "clip_grad": True},
    "megatron": {"kernels": "fused", "attention": "flash2", "cross_entropy": "fp32",
                 "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": "none",
                 "rotary": "rotate_half", "optimizer_impl": "fused", "compile_loss": False,
                 "clip_grad": True},
}
DEFAULT_FRAMEWORK = "hf"
# How each framework runs a mixture of experts' GEMMs (job/moe.py): transformers loops over the
# experts (MixtralSparseMoeBlock.forward, Qwen2MoeSparseMoeBlock.forward); Megatron-Core's
# TEGroupedMLP / GroupedMLP, torchtitan's GroupedExperts (torch._grouped_mm), torchtune's
# GroupedExperts and llm-foundry's MegaBlocks dMoE run one grouped GEMM.
EXPERT_GEMMS = {"hf": "loop", "torchtune": "grouped", "torchtitan": "grouped",
                "llm-foundry": "grouped", "megatron": "grouped"}
# Whose launch sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and from which PyTorch on:
# torchtitan's run_llama_train.sh since a5e57e4 (2024-10-22; run_train.sh now), torchtune's own
# __init__.py since 9d91fe3 (2025-06-20, PR #2841) unless the variable is set; the others leave
# PyTorch's default (off). A stack older than the first PyTorch release after the change
# (2.6 of 2025-01-29; 2.8 of 2025-08-06) ran the framework before it, with the default.
EXPANDABLE_SEGMENTS_SINCE: dict[str, tuple[int, int] | None] = {
    "hf": None, "torchtune": (2, 8), "torchtitan": (2, 6), "llm-foundry": None,
    "megatron": None}


def expandable_segments(framework: str, stack: Stack) -> bool:
    """Whether the framework's launch turned the allocator's expandable segments on."""
    since = EXPANDABLE_SEGMENTS_SINCE[framework]
    return since is not None and stack.torch[:2] >= since


@dataclass(frozen=True)
class Recipe:
    """A resolved recipe: every key set, and which ones came from the framework bundle."""

    framework: str
    kernels: str
    attention: str  # the implementation (flash2, flash3, sdpa, triton, eager)
    cross_entropy: str
    precision: str
    optimizer: str
    activation_checkpointing: str
    rotary: str
    optimizer_impl: str
    compile_loss: bool
    clip_grad: bool
    optimizer_in_bwd: bool = False  # the step per parameter in backward (training key)
    amp: str | None = None  # apex amp opt_level (training key): None (torch.autocast), o1, o2
    ddp: str = "torch"  # the DDP wrapper (training key): torch or apex
    from_bundle: tuple[str, ...] = ()  # the keys the bundle set (the rest were given)
    # a mixture of experts' GEMMs (training.expert_gemms, else EXPERT_GEMMS of the framework)
    expert_gemms: str = "loop"
    # the caching allocator's expandable segments (training key, else the framework's launch)
    expandable_segments: bool = False

    @property
    def loss_compiled(self) -> bool:
        return self.kernels == "compiled" and self.compile_loss

    @property
    def autocast(self) -> bool:
        """torch.autocast over fp32 weights (AMP, apex O1); Megatron keeps bf16 parameters
        beside fp32 main parameters instead and accumulates its weight gradients into fp32 in
        the GEMM, and apex O2 runs a 16-bit model beside fp32 master weights."""
        return (self.precision in ("bf16", "fp16") and self.framework != "megatron"
                and not self.amp_o2)

    @property
    def amp_o2(self) -> bool:
        """apex amp O2: a 16-bit model, fp32 master weights, 16-bit gradients."""
        return self.amp == "o2" and self.precision in ("bf16", "fp16")

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k in ("framework", *KEYS)}
        out["optimizer_in_bwd"] = self.optimizer_in_bwd
        if self.amp is not None:
            out["amp"] = self.amp
        if self.ddp != "torch":
            out["ddp"] = self.ddp
        if self.expandable_segments:
            out["expandable_segments"] = True
        out["from_framework"] = list(self.from_bundle)
        return out

    def words(self) -> str:
        """One line: ``framework hf: kernels eager, attention sdpa, ...``."""
        return f"framework {self.framework}: " + ", ".join(
            f"{k} {getattr(self, k)}" for k in KEYS) + (
            ", optimizer_in_bwd" if self.optimizer_in_bwd else "") + (
            f", apex amp {self.amp}" if self.amp else "") + (
            ", apex DDP" if self.ddp == "apex" else "")


def resolve(training: TrainingConfig, stack: Stack = TODAY,
            family: str | None = None) -> Recipe:
    """The recipe of a ``training`` block: explicit keys, else the framework's bundle as it
    ran on the software ``stack`` for a model of ``family`` (its attention:
    ``bundle_attention``)."""
    given = training.given
    framework = training.framework if "framework" in given else DEFAULT_FRAMEWORK
    bundle = dict(_BUNDLES[framework])
    bundle["attention"] = bundle_attention(framework, stack, family)
    values = {k: getattr(training, k) if k in given else bundle[k] for k in KEYS}
    if values["attention"] == "flash":  # the older name of FlashAttention-2
        values["attention"] = "flash2"
    details = {k: v for k, v in bundle.items() if k not in KEYS}
    if training.optimizer_in_bwd:  # torchtune refuses clip_grad_norm with optimizer_in_bwd
        details["clip_grad"] = False
    return Recipe(framework=framework, **values, **details,
                  optimizer_in_bwd=training.optimizer_in_bwd, amp=training.amp,
                  ddp=training.ddp, from_bundle=tuple(k for k in KEYS if k not in given),
                  expert_gemms=training.expert_gemms or EXPERT_GEMMS[framework],
                  expandable_segments=(expandable_segments(framework, stack)
                                       if training.expandable_segments is None
                                       else training.expandable_segments))


def bundle_attention(framework: str, stack: Stack, family: str | None = None) -> str:
    """The attention implementation a framework's shipped configs select on a stack:
    transformers' default ``attn_implementation`` is ``sdpa`` only where torch >= 2.1.1
    (utils/import_utils.py is_torch_sdpa_available) and the model's class takes it (from
    4.36 for Llama, 4.41 for BERT, 4.42 for GPT-2: software.HF_SDPA_SINCE), else ``eager``;
    llm-foundry's benchmark configs ran ``attn_impl: triton``
    (scripts/train/benchmarking/submit_benchmarks.py ``--attn_impl`` default 'triton',
    yamls/pretrain/mpt-*.yaml) until v0.7.0 removed it
    (2024-03-26, torch >= 2.2.1), and ``flash`` (flash-attn 2) since (submit_benchmarks.py
    default 'flash'); torchtune and torchtitan call F.scaled_dot_product_attention
    (torchtune modules/attention.py, torchtitan models/attention.py); Megatron-LM runs
    flash-attn through Transformer Engine."""
    if framework == "hf" and not software.hf_sdpa(stack, family):
        return "eager"
    if framework == "llm-foundry" and stack.torch < software.FOUNDRY_NO_TRITON:
        return "triton"
    return str(_BUNDLES[framework]["attention"])


def bundle(framework: str, stack: Stack = TODAY) -> dict[str, Any]:
    """A framework's defaults on a stack (for documentation and tests)."""
    return {**_BUNDLES[framework], "attention": bundle_attention(framework, stack)}
