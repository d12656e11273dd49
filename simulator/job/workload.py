"""The training job: the model's parameters, the batch, the resolved recipe, and its ops.

`Job.from_config(workload)` checks the fine-tuning settings (LoRA targets, a transformer for
LoRA / QLoRA), marks the layers LoRA wraps and lists the parameters in ``model.parameters()``
order, laid out by simulator/job/parameters.py as Hugging Face and PEFT build them (PyTorch
DDP buckets follow that order). A ``Job`` carries the micro-batch, sequence length, gradient
accumulation and the resolved recipe, and the sizes and settings the memory model reads.

The ops of one micro-batch (forward, backward, recompute, optimizer) are built in
simulator/job/ops.py; their time on a GPU in simulator/job/compute.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from simulator.catalog import software
from simulator.catalog.software import TODAY, Stack
from simulator.errors import InputError, quoted
from simulator.inputs.schema import (
    LORA_TARGETS,
    GenericLayer,
    LoraConfig,
    TrainingConfig,
    WorkloadConfig,
)
from simulator.job.attention import EagerChain, eager_chain
from simulator.job.diffusion import UNetShape
from simulator.job.moe import role as moe_role
from simulator.job.parameters import (
    Arch,
    Module,
    ParamTensor,
    generic_modules,
    module_params,
    transformer_modules,
)
from simulator.job.recipe import Recipe
from simulator.job.recipe import resolve as resolve_recipe
from simulator.job.vision import is_vision
from simulator.memo import Memo

if TYPE_CHECKING:
    from simulator.job.ops import Op, Phase


@dataclass(frozen=True)
class Job:
    """One training job on one GPU's share of the batch: parameters and ops of a step."""

    name: str
    arch: Arch | None  # None for a generic (layer-list) workload
    generic_layers: tuple[GenericLayer, ...]
    training: TrainingConfig
    micro_batch: int
    seq_len: int
    grad_accum: int
    modules: tuple[Module, ...]
    # shared by every job of one model and its adapters (_MODULES): a tuple, never changed
    params: tuple[ParamTensor, ...] = field(hash=False, compare=False)
    recipe: Recipe = field(default_factory=lambda: resolve_recipe(TrainingConfig(seq_len=1)))
    software: Stack = TODAY  # the software stack (catalog/software.py)
    ep: int = 1  # expert parallelism: the ranks a mixture of experts' experts are spread over
    unet: UNetShape | None = None  # a diffusion UNet (job/diffusion.py): its blocks are layers
    # built on first use: every strategy, the memory model and the size check read them
    _ops: dict[tuple[str, bool], tuple[Op, ...]] = field(default_factory=dict, init=False,
                                                         repr=False,
                                            hash=False, compare=False)
    _by_block: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False,
                                            hash=False, compare=False)

    @staticmethod
    def from_config(cfg: WorkloadConfig, *, micro_batch: int | None = None,
                    seq_len: int | None = None, grad_accum: int | None = None,
                    ep: int = 1) -> Job:
        """``ep`` > 1: one rank's share under expert parallelism, its own experts of each MoE
        block (experts / ep of them, standing for whichever the rank holds) beside the rest of
        the model."""
        t = cfg.training
        for key, value in (("micro_batch", micro_batch), ("seq_len", seq_len),
                           ("grad_accum", grad_accum)):
            if value is not None and value < 1:
                raise InputError(f"must be at least 1, got {value}", key=f"training.{key}")
        if t.finetune != "full" and cfg.model is None and cfg.unet is None:
            raise InputError(f"{t.finetune} needs a transformer `model`", key="training.finetune")
        arch = Arch.from_model(cfg.model) if cfg.model is not None else None
        unet = UNetShape.of(cfg.unet) if cfg.unet is not None else None
        # an advice's or a sweep's candidates differ in batch and recipe, not in the model
        # and its adapters: they share its modules and parameters
        model = (arch, repr(cfg.unet), repr(cfg.layers), t.finetune, repr(t.lora), ep)
        mods, params = _MODULES.get(model, lambda: _modules_and_params(cfg, arch, unet, ep))
        stack = software.resolve(t.software)
        family = arch.family if arch is not None else None
        recipe = resolve_recipe(t, stack, family)
        # a stack that lacks it, fp32 inputs it does not take, or (transformers) a model
        # class without it: refused
        software.attention_kernel(recipe.attention, stack, fp32=recipe.precision == "fp32")
        if recipe.framework == "hf":
            software.check_hf_sdpa(recipe.attention, stack, family)
        job = Job(name=cfg.name, arch=arch, generic_layers=tuple(cfg.layers or ()), training=t,
                  micro_batch=micro_batch or t.micro_batch, seq_len=seq_len or t.seq_len,
                  grad_accum=grad_accum or t.grad_accum, modules=mods, params=params,
                  recipe=recipe, software=stack, ep=ep, unet=unet)
        if unet is not None:  # its blocks as the layers memory and the strategies read
            from simulator.job import diffusion

            job = replace(job, generic_layers=diffusion.generic_layers(job))
        return job

    # --- sizes ------------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        """Transformer blocks (FSDP units), or generic layers."""
        return self.arch.layers if self.arch else len(self.generic_layers)

    @property
    def blocks(self) -> list[int]:
        """Block ids in forward order: -1 (embeddings), 0..L-1, L (final norm, head)."""
        if self.arch is None:
            return list(range(self.n_blocks))
        return list(range(-1, self.n_blocks + 1))

    def block_params(self, block: int) -> list[int]:
        """Indices into `params` of one block's tensors, in registration order."""
        if not self._by_block and self.params:  # one pass for all blocks, not one per block
            for i, p in enumerate(self.params):
                self._by_block.setdefault(p.block, []).append(i)
        return list(self._by_block.get(block, ()))

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def n_model_params(self) -> int:
        """The whole model's parameters: ``params`` lists one rank's, which under expert
        parallelism holds 1/ep of the experts."""
        return self.n_params + self._expert_params * (self.ep - 1)

    @property
    def n_active(self) -> int:
        """Parameters one token's forward uses: all but the experts it is not routed to (a
        mixture of experts' active count, as model cards give it; n_params otherwise)."""
        a = self.arch
        if a is None or a.moe is None:
            return self.n_params
        unused = self._expert_params * self.ep * (a.moe.experts - a.moe.top_k) // a.moe.experts
        return self.n_model_params - unused

    @property
    def _expert_params(self) -> int:
        """This rank's routed experts' parameters."""
        return sum(p.numel for p in self.params if ".experts." in p.name)

    @property
    def n_trainable(self) -> int:
        return sum(p.numel for p in self.params if p.trainable)

    @property
    def n_quantized(self) -> int:
        return sum(p.numel for p in self.params if p.quantized)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    # --- dimensions and settings the memory model reads --------------------------------------
    @property
    def hidden(self) -> int:
        return self.arch.hidden if self.arch else 0

    @property
    def heads(self) -> int:
        return self.arch.heads if self.arch else 0

    @property
    def kv_heads(self) -> int:
        return self.arch.kv_heads if self.arch else 0

    @property
    def ffn_hidden(self) -> int:
        return self.arch.ffn_hidden if self.arch else 0

    @property
    def vocab(self) -> int:
        return self.arch.vocab if self.arch else 0

    @property
    def n_layers(self) -> int:
        return self.n_blocks

    @property
    def precision(self) -> str:
        return self.recipe.precision

    @property
    def optimizer(self) -> str:
        return self.recipe.optimizer

    @property
    def checkpointing(self) -> str:
        return self.recipe.activation_checkpointing

    @property
    def kernels(self) -> str:
        return self.recipe.kernels

    @property
    def has_attention(self) -> bool:
        """A transformer's or a UNet's attention; a model of generic layers (a ResNet) has
        none, and its report names no attention."""
        return self.arch is not None or self.unet is not None

    def recipe_json(self) -> dict[str, Any]:
        """The recipe as reports give it: no attention where the model has none."""
        out = self.recipe.to_json()
        if not self.has_attention:
            out["attention"] = None
        return out

    @property
    def attention_kernel(self) -> str:
        """What the attention implementation runs on the job's stack and batches: flash2,
        flash1, flash3, triton, mem_efficient or eager (catalog/software.py); a mask tensor
        (padded batches, or transformers 4.38-4.39's Llama classes) keeps sdpa off its flash
        kernel."""
        masked = self.training.padded or self.hf_mask_every_call
        return software.attention_kernel(self.recipe.attention, self.software, padded=masked,
                                         fp32=self.precision == "fp32")

    @property
    def hf_mask_every_call(self) -> bool:
        """transformers gives this job's sdpa a mask tensor on every call (its 4.38-4.39
        Llama classes: catalog/software.py HF_CAUSAL_MASK_ALWAYS)."""
        return (self.recipe.framework == "hf" and self.arch is not None
                and self.arch.family == "llama" and software.hf_masks_every_call(self.software))

    @property
    def torchrun(self) -> bool:
        """Started by torchrun: OMP_NUM_THREADS=1 in every process of a multi-GPU run."""
        launcher = self.training.launcher
        if launcher is not None:
            return launcher == "torchrun"
        return self.recipe.framework in ("torchtune", "torchtitan")

    @property
    def eager_chain(self) -> EagerChain:
        """The passes over the scores of eager attention as this job's modules run them
        (job/attention.py eager_chain): Megatron's fused softmax under fused or compiled
        kernels, else the family's transformers module, under autocast where the recipe
        runs torch.autocast over fp32 parameters."""
        assert self.arch is not None
        if self.kernels != "eager":
            pattern = "fused"
        elif self.arch.attention_sinks:
            pattern = "gpt_oss"
        else:
            pattern = {"gpt2": "gpt2", "bert": "bert"}.get(self.arch.family, "llama")
        return eager_chain(pattern, e=self.activation_bytes, autocast=self.recipe.autocast,
                           dropout=self.training.dropout > 0)

    @property
    def flash_attention(self) -> bool:
        """The attention core keeps no s x s scores (every kernel but eager)."""
        return self.attention_kernel != "eager"

    @property
    def grad_bytes(self) -> int:
        """Bytes per element of the trainable weights' gradients (.grad): fp32 under mixed
        precision (PyTorch AMP and FSDP keep fp32 master weights, so .grad is fp32) and fp32
        training, 16-bit under pure-bf16 training and apex O2 (a 16-bit model)."""
        return 2 if self.precision == "pure-bf16" or self.recipe.amp_o2 else 4

    @property
    def master_bytes(self) -> int:
        """Bytes per element of the weights and gradients the optimizer steps: fp32 but under
        pure-bf16 (apex O2 steps fp32 master copies of its 16-bit model)."""
        return 2 if self.precision == "pure-bf16" else 4

    @property
    def hidden_dropout(self) -> bool:
        """Whether the hidden states are dropped too (a 1-byte mask per element): GPT-2 and BERT
        drop them at their dropout rate (GPT2Config resid_pdrop and embd_pdrop equal attn_pdrop,
        0.1; BertConfig hidden_dropout_prob equals attention_probs_dropout_prob), the
        workload's ``dropout``; Llama has no dropout modules, MPT-7B's resid_pdrop is 0."""
        if self.arch is None:
            return False
        return (self.arch.encoder or self.arch.family == "gpt2") and self.training.dropout > 0

    @property
    def finetune(self) -> str:
        return self.training.finetune

    @property
    def lora_rank(self) -> int:
        if self.finetune == "full":
            return 0
        return (self.training.lora or _default_lora()).rank

    @property
    def lora_dropout(self) -> float:
        """PEFT's lora_dropout: above 0, each adapter drops its own copy of the layer input."""
        if self.finetune == "full":
            return 0.0
        return (self.training.lora or _default_lora()).dropout

    @property
    def output_logit_bytes(self) -> float:
        """Bytes per logit of the model output the training loop keeps through backward
        (``training.keeps_output``), 0 if it drops it: fp32 from a Llama-family model under
        transformers before 4.46 (it upcast them in forward), else the compute dtype; a fused
        linear cross-entropy makes none (catalog/software.py LOSS_FUNCTION)."""
        if not self.training.keeps_output or self.recipe.cross_entropy == "fused-linear":
            return 0.0
        upcast = (self.recipe.framework == "hf" and self.recipe.cross_entropy == "fp32"
                  and self.arch is not None and self.arch.family == "llama"
                  and self.software.transformers < software.LOSS_FUNCTION)
        return 4.0 if upcast else float(self.activation_bytes)

    @property
    def activation_bytes(self) -> int:
        """Bytes per element of activations and 16-bit weights: 2 under bf16/fp16, 4 under fp32."""
        return 4 if self.precision == "fp32" else 2

    # --- ops (simulator/job/ops.py) ------------------------------------------------------------
    def ops(self, phase: Phase, *, autocast: bool = False) -> list[Op]:
        """One micro-batch's ops of a phase (ops.py), built once per job; a new list each call.
        ``autocast``: the fp32 weights are cast to 16 bit as each forward uses them and their
        gradients back to fp32 (torch.autocast under DDP or on one GPU; FSDP and ZeRO keep
        16-bit parameters and cast in their own copies)."""
        key = (phase, autocast and self.recipe.autocast)
        if key not in self._ops:
            from simulator.job import ops

            self._ops[key] = tuple(ops.build(self, phase, autocast=key[1]))
        return list(self._ops[key])

    def forward_ops(self, *, autocast: bool = False) -> list[Op]:
        return self.ops("forward", autocast=autocast)

    def backward_ops(self, *, autocast: bool = False) -> list[Op]:
        """Backward of one micro-batch, recompute ops included (checkpointing)."""
        return self.ops("backward", autocast=autocast)

    def optimizer_ops(self) -> list[Op]:
        return self.ops("optimizer")

    def model_flops_per_step(self) -> float:
        """Model FLOPs of one optimizer step on this GPU (all micro-batches), for MFU."""
        from simulator.job import ops

        return ops.model_flops_per_micro_batch(self) * self.grad_accum

    def hardware_flops_per_step(self) -> float:
        """Model FLOPs plus the forward FLOPs checkpointing recomputes, for HFU."""
        from simulator.job import ops

        return self.model_flops_per_step() + (ops.recompute_flops_per_micro_batch(self)
                                              * self.grad_accum)


# the modules and parameters of a model and its adapters, by value (Job.from_config)
_MODULES: Memo[tuple[tuple[Module, ...], tuple[ParamTensor, ...]]] = Memo(limit=16)


def _modules_and_params(cfg: WorkloadConfig, arch: Arch | None, unet: UNetShape | None,
                        ep: int) -> tuple[tuple[Module, ...], tuple[ParamTensor, ...]]:
    """The modules one rank holds (its experts' share under ``ep``), LoRA-wrapped as the
    training section says, and their parameters in ``model.parameters()`` order."""
    t = cfg.training
    if arch is not None:
        mods = transformer_modules(arch)
    elif unet is not None:
        mods = unet.modules()
    else:
        mods = generic_modules(list(cfg.layers or []))
    if ep > 1:
        mods = _local_experts(arch, mods, ep)
    lora_rank = 0
    if t.finetune != "full":
        family = arch.family if arch is not None else "unet"
        lora = t.lora or _default_lora(family)
        lora_rank = lora.rank
        known = LORA_TARGETS[family]
        unknown = [x for x in lora.targets if x not in known]
        if unknown or not lora.targets:
            raise InputError(f"LoRA targets {quoted(unknown)} match no {family} linear "
                             f"layer; choose from {', '.join(known)}",
                             key="training.lora.targets")
        targets = set(lora.targets)

        fused_experts = arch is not None and arch.moe is not None and \
            arch.moe.names == "gpt_oss"

        def wrapped(m: Module) -> bool:
            if unet is not None:  # PEFT matches a target as the path's suffix
                return m.kind == "linear" and any(m.path.endswith("." + x) for x in targets)
            if fused_experts and moe_role(m) in ("experts", "router"):
                # gpt-oss's router and experts are no nn.Linear: target_modules cannot reach
                # them (PEFT's target_parameters, not modelled, can)
                return False
            # adapters on the language model (LLaVA's recipes leave the vision tower out)
            return m.leaf in targets and m.path != "lm_head" and not is_vision(m)

        mods = [Module(m.path, m.kind, m.in_features, m.out_features, m.bias, m.block,
                       lora=wrapped(m)) for m in mods]
    params = [p for m in mods for p in module_params(
        m, peft=t.finetune != "full", finetune=t.finetune, lora_rank=lora_rank)]
    # a vision-language model's image encoder stays frozen (its projector trains)
    params = [replace(p, trainable=False) if p.trainable and _frozen_vision(p.name) else p
              for p in params]
    return tuple(mods), tuple(params)


def _frozen_vision(name: str) -> bool:
    name = name.removeprefix("base_model.model.")
    return name.startswith(("vision_tower.", "visual.")) and ".merger." not in name \
        and "lora_" not in name


def _local_experts(arch: Arch | None, mods: list[Module], ep: int) -> list[Module]:
    """The modules one rank holds under expert parallelism: every expert's are kept only for
    the first experts / ep (all ranks' shares are alike)."""
    if arch is None or arch.moe is None:
        raise InputError(f"--ep {ep}: expert parallelism needs a mixture of experts (model.moe)")
    if arch.moe.experts % ep:
        raise InputError(f"--ep {ep} must divide the {arch.moe.experts} experts")
    local = arch.moe.experts // ep
    return [m for m in mods if ".experts." not in m.path
            or int(m.path.split(".experts.", 1)[1].split(".", 1)[0]) < local]


def _default_lora(family: str = "llama") -> LoraConfig:
    if family == "unet":  # diffusers' train_text_to_image_lora.py targets
        return LoraConfig(targets=["to_k", "to_q", "to_v", "to_out.0"])
    return LoraConfig()
