"""The training job: a model's parameters in Hugging Face registration order, and its ops.

`Job.from_config(workload)` lays out a transformer the way Hugging Face builds it
(LlamaForCausalLM, GPT2LMHeadModel, MPTForCausalLM; Qwen2 is the Llama layout with q/k/v biases;
the encoder BertForQuestionAnswering) and lists its parameters exactly in
``model.parameters()`` order, because PyTorch DDP buckets follow that order. With LoRA /
QLoRA the names and order are PEFT's (``get_peft_model``).
A generic workload (``layers:``) is a list of layers with given parameters and FLOPs.

The ops of one micro-batch (forward, backward, recompute, optimizer) are built in
simulator/job/ops.py; their time on a GPU in simulator/job/compute.py.

Registration order, from the Hugging Face sources (transformers
``models/llama/modeling_llama.py``: LlamaModel.__init__ registers embed_tokens, layers, norm;
LlamaDecoderLayer self_attn, mlp, input_layernorm, post_attention_layernorm; LlamaAttention
q/k/v/o_proj; LlamaMLP gate/up/down_proj; ``models/gpt2/modeling_gpt2.py``: GPT2Model wte, wpe,
h, ln_f; GPT2Block ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj); Conv1D registers
weight (in, out) then bias; ``models/mpt/modeling_mpt.py`` and mosaicml llm-foundry
``blocks.py``: wte, blocks (norm_1, attn.Wqkv, attn.out_proj, norm_2, ffn.up_proj,
ffn.down_proj), norm_f; ``models/bert/modeling_bert.py``: BertEmbeddings word_embeddings,
position_embeddings, token_type_embeddings, LayerNorm; BertLayer attention.self (query, key,
value), attention.output (dense, LayerNorm), intermediate.dense, output (dense, LayerNorm);
BertForQuestionAnswering builds ``BertModel(config, add_pooling_layer=False)`` then
``qa_outputs = nn.Linear(hidden, num_labels=2)``, so no pooler). A tied lm_head is the
embedding's tensor and ``parameters()`` yields it once, so it is not listed. PEFT
(``peft/tuners/lora/layer.py``, LoraLayer.__init__) keeps the wrapped layer as ``base_layer``
and registers ``lora_A`` then ``lora_B`` after it; ``get_peft_model`` prefixes every name with
``base_model.model.``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from simulator.errors import InputError
from simulator.inputs.schema import (
    GenericLayer,
    LoraConfig,
    ModelConfig,
    TrainingConfig,
    WorkloadConfig,
)
from simulator.job.recipe import Recipe
from simulator.job.recipe import resolve as resolve_recipe

if TYPE_CHECKING:
    from simulator.job.ops import Op, Phase

ModuleKind = Literal["linear", "conv1d", "norm", "embedding", "generic"]
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class ParamTensor:
    """One registered parameter tensor. Sizes are element counts (dtype comes from training)."""

    name: str  # as model.named_parameters() prints it
    shape: tuple[int, ...]
    trainable: bool
    block: int  # -1 embeddings, 0..L-1 transformer blocks, L final norm / head
    quantized: bool = False  # QLoRA: stored as 4-bit NF4 (bitsandbytes Linear4bit)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Module:
    """An nn.Module that owns parameters: a linear layer, a norm, an embedding, a generic layer."""

    path: str  # e.g. "model.layers.0.self_attn.q_proj"
    kind: ModuleKind
    in_features: int  # embedding: vocabulary size; norm: width
    out_features: int
    bias: bool
    block: int
    lora: bool = False
    sizes: tuple[int, ...] = ()  # generic layers: each parameter tensor's elements, if given

    @property
    def leaf(self) -> str:
        return self.path.rsplit(".", 1)[-1]


# Per family: norm, MLP, linear biases, positions, tied head (the Hugging Face configs' defaults:
# LlamaConfig tie_word_embeddings False; GPT2Config True with learned wpe; MPT-7B config.json
# no_bias true, alibi true, tie by construction).
_FAMILY_DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {"norm": "rmsnorm", "mlp": "swiglu", "bias": False, "positions": "rotary",
              "tie": False},
    "gpt2": {"norm": "layernorm", "mlp": "gelu", "bias": True, "positions": "learned",
             "tie": True},
    "mpt": {"norm": "layernorm", "mlp": "gelu", "bias": False, "positions": "alibi",
            "tie": True},
}
_FAMILY_DEFAULTS["bert"] = {"norm": "layernorm", "mlp": "gelu", "bias": True,  # BertConfig
                            "positions": "learned", "tie": False}  # QA head: no LM head to tie
_ALLOWED_POSITIONS = {"llama": {"rotary"}, "gpt2": {"learned"}, "mpt": {"alibi", "learned"},
                      "bert": {"learned"}}
ENCODERS = ("bert",)  # bidirectional attention, a task head instead of the LM head
BERT_TYPE_VOCAB = 2  # BertConfig.type_vocab_size default (segments A and B)
QA_LABELS = 2  # BertForQuestionAnswering num_labels: start and end logits per token
# Linear layers LoRA can target, per family (names as in the HF modules above).
LORA_TARGETS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "mpt": ("Wqkv", "out_proj", "up_proj", "down_proj"),
    "bert": ("query", "key", "value", "dense"),  # PEFT suffix match: "dense" is all three
}


@dataclass(frozen=True)
class Arch:
    """A transformer's resolved shape (family defaults applied)."""

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    norm: str
    mlp: str
    bias: bool
    qkv_bias: bool
    positions: str
    max_positions: int
    tied: bool

    @property
    def encoder(self) -> bool:
        """Bidirectional (no causal mask) with a task head, not a decoder with an LM head."""
        return self.family in ENCODERS

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @staticmethod
    def from_model(m: ModelConfig) -> Arch:
        d = _FAMILY_DEFAULTS.get(m.family)
        if d is None:
            raise InputError(f"unknown model family {m.family!r}; known: "
                             f"{', '.join(_FAMILY_DEFAULTS)}",
                             key="model.family")
        positions = m.positions or str(d["positions"])
        if positions not in _ALLOWED_POSITIONS[m.family]:
            raise InputError(f"{m.family} models use {sorted(_ALLOWED_POSITIONS[m.family])} "
                             f"positions, got {positions!r}", key="model.positions")
        bias = bool(d["bias"]) if m.bias is None else m.bias
        return Arch(
            family=m.family, layers=m.layers, hidden=m.hidden, heads=m.heads,
            kv_heads=m.kv_heads or m.heads, ffn_hidden=m.ffn_hidden or 4 * m.hidden,
            vocab=m.vocab, norm=m.norm or str(d["norm"]), mlp=m.mlp or str(d["mlp"]),
            bias=bias, qkv_bias=bias if m.qkv_bias is None else m.qkv_bias,
            positions=positions, max_positions=m.max_positions or 1024,
            tied=bool(d["tie"]) if m.tie_embeddings is None else m.tie_embeddings,
        )


def transformer_modules(a: Arch) -> list[Module]:
    """The parameter-owning modules of a transformer, in registration order."""
    if a.family == "bert":
        return bert_modules(a)
    h, f, qkv_out = a.hidden, a.ffn_hidden, a.hidden + 2 * a.kv_dim
    L = a.layers
    norm_bias = a.norm == "layernorm" and (a.bias or a.family == "gpt2")
    mods: list[Module] = []

    def add(path: str, kind: ModuleKind, i: int, o: int, bias: bool, block: int) -> None:
        mods.append(Module(path, kind, i, o, bias, block))

    if a.family == "llama":
        add("model.embed_tokens", "embedding", a.vocab, h, False, -1)
        for b in range(L):
            p = f"model.layers.{b}"
            add(f"{p}.self_attn.q_proj", "linear", h, h, a.qkv_bias, b)
            add(f"{p}.self_attn.k_proj", "linear", h, a.kv_dim, a.qkv_bias, b)
            add(f"{p}.self_attn.v_proj", "linear", h, a.kv_dim, a.qkv_bias, b)
            add(f"{p}.self_attn.o_proj", "linear", h, h, a.bias, b)
            add(f"{p}.mlp.gate_proj", "linear", h, f, a.bias, b)
            add(f"{p}.mlp.up_proj", "linear", h, f, a.bias, b)
            add(f"{p}.mlp.down_proj", "linear", f, h, a.bias, b)
            add(f"{p}.input_layernorm", "norm", h, h, norm_bias, b)
            add(f"{p}.post_attention_layernorm", "norm", h, h, norm_bias, b)
        add("model.norm", "norm", h, h, norm_bias, L)
    elif a.family == "gpt2":
        add("transformer.wte", "embedding", a.vocab, h, False, -1)
        add("transformer.wpe", "embedding", a.max_positions, h, False, -1)
        for b in range(L):
            p = f"transformer.h.{b}"
            add(f"{p}.ln_1", "norm", h, h, norm_bias, b)
            add(f"{p}.attn.c_attn", "conv1d", h, qkv_out, a.bias, b)
            add(f"{p}.attn.c_proj", "conv1d", h, h, a.bias, b)
            add(f"{p}.ln_2", "norm", h, h, norm_bias, b)
            add(f"{p}.mlp.c_fc", "conv1d", h, f, a.bias, b)
            add(f"{p}.mlp.c_proj", "conv1d", f, h, a.bias, b)
        add("transformer.ln_f", "norm", h, h, norm_bias, L)
    else:  # mpt
        add("transformer.wte", "embedding", a.vocab, h, False, -1)
        if a.positions == "learned":
            add("transformer.wpe", "embedding", a.max_positions, h, False, -1)
        for b in range(L):
            p = f"transformer.blocks.{b}"
            add(f"{p}.norm_1", "norm", h, h, norm_bias, b)
            add(f"{p}.attn.Wqkv", "linear", h, qkv_out, a.qkv_bias, b)
            add(f"{p}.attn.out_proj", "linear", h, h, a.bias, b)
            add(f"{p}.norm_2", "norm", h, h, norm_bias, b)
            add(f"{p}.ffn.up_proj", "linear", h, f, a.bias, b)
            add(f"{p}.ffn.down_proj", "linear", f, h, a.bias, b)
        add("transformer.norm_f", "norm", h, h, norm_bias, L)
    if not a.tied:
        add("lm_head", "linear", h, a.vocab, False, L)
    return mods


def bert_modules(a: Arch) -> list[Module]:
    """BertForQuestionAnswering: embeddings (three tables, LayerNorm), post-LN encoder layers
    with biases everywhere, the QA head; block -1 embeddings, 0..L-1 layers, L the head."""
    h, f, L = a.hidden, a.ffn_hidden, a.layers
    mods = [Module("bert.embeddings.word_embeddings", "embedding", a.vocab, h, False, -1),
            Module("bert.embeddings.position_embeddings", "embedding", a.max_positions, h,
                   False, -1),
            Module("bert.embeddings.token_type_embeddings", "embedding", BERT_TYPE_VOCAB, h,
                   False, -1),
            Module("bert.embeddings.LayerNorm", "norm", h, h, True, -1)]
    for b in range(L):
        p = f"bert.encoder.layer.{b}"
        mods += [Module(f"{p}.attention.self.{x}", "linear", h, h, a.qkv_bias, b)
                 for x in ("query", "key", "value")]
        mods += [Module(f"{p}.attention.output.dense", "linear", h, h, a.bias, b),
                 Module(f"{p}.attention.output.LayerNorm", "norm", h, h, True, b),
                 Module(f"{p}.intermediate.dense", "linear", h, f, a.bias, b),
                 Module(f"{p}.output.dense", "linear", f, h, a.bias, b),
                 Module(f"{p}.output.LayerNorm", "norm", h, h, True, b)]
    mods.append(Module("qa_outputs", "linear", h, QA_LABELS, True, L))
    return mods


def generic_modules(layers: list[GenericLayer]) -> list[Module]:
    return [Module(layer.name, "generic", layer.params, layer.tensors, False, i,
                   sizes=tuple(layer.tensor_numels or ()))
            for i, layer in enumerate(layers)]


def module_params(mod: Module, *, peft: bool, finetune: str, lora_rank: int) -> list[ParamTensor]:
    """The parameters one module registers, in order (PEFT-wrapped when mod.lora)."""
    if mod.kind == "generic":  # the given sizes, or the parameters split evenly, remainder first
        n, k = mod.in_features, mod.out_features
        sizes = list(mod.sizes) or [n // k + (1 if i < n % k else 0) for i in range(k)]
        return [ParamTensor(f"{mod.path}.param{i}", (s,), True, mod.block)
                for i, s in enumerate(sizes)]
    prefix = PEFT_PREFIX if peft else ""
    frozen_base = finetune != "full"
    shapes: list[tuple[str, tuple[int, ...]]]
    if mod.kind == "linear":
        shapes = [("weight", (mod.out_features, mod.in_features))]
    elif mod.kind in ("conv1d", "embedding"):  # Conv1D weight is (nx, nf) (pytorch_utils.py)
        shapes = [("weight", (mod.in_features, mod.out_features))]
    else:
        shapes = [("weight", (mod.out_features,))]
    if mod.bias:
        shapes.append(("bias", (mod.out_features,)))
    # bitsandbytes quantizes the nn.Linear weights of the blocks, not lm_head (transformers
    # get_keys_to_not_convert keeps the output embedding in 16 bit), norms or embeddings.
    quantize = finetune == "qlora" and mod.kind in ("linear", "conv1d") and mod.path != "lm_head"
    base = f"{prefix}{mod.path}.base_layer" if mod.lora else f"{prefix}{mod.path}"
    out = [ParamTensor(f"{base}.{suffix}", shape, not frozen_base, mod.block,
                       quantized=quantize and suffix == "weight")
           for suffix, shape in shapes]
    if mod.lora:
        out.append(ParamTensor(f"{prefix}{mod.path}.lora_A.default.weight",
                               (lora_rank, mod.in_features), True, mod.block))
        out.append(ParamTensor(f"{prefix}{mod.path}.lora_B.default.weight",
                               (mod.out_features, lora_rank), True, mod.block))
    return out


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
    params: list[ParamTensor] = field(hash=False, compare=False)
    recipe: Recipe = field(default_factory=lambda: resolve_recipe(TrainingConfig(seq_len=1)))
    # built on first use: every strategy, the memory model and the size check read them
    _ops: dict[tuple[str, bool], tuple[Op, ...]] = field(default_factory=dict, init=False,
                                                         repr=False,
                                            hash=False, compare=False)
    _by_block: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False,
                                            hash=False, compare=False)

    @staticmethod
    def from_config(cfg: WorkloadConfig, *, micro_batch: int | None = None,
                    seq_len: int | None = None, grad_accum: int | None = None) -> Job:
        t = cfg.training
        for key, value in (("micro_batch", micro_batch), ("seq_len", seq_len),
                           ("grad_accum", grad_accum)):
            if value is not None and value < 1:
                raise InputError(f"must be at least 1, got {value}", key=f"training.{key}")
        if t.finetune != "full" and cfg.model is None:
            raise InputError(f"{t.finetune} needs a transformer `model`", key="training.finetune")
        arch: Arch | None = None
        if cfg.model is not None:
            arch = Arch.from_model(cfg.model)
            mods = transformer_modules(arch)
        else:
            mods = generic_modules(list(cfg.layers or []))
        lora_rank = 0
        if t.finetune != "full":
            assert arch is not None
            lora = t.lora or _default_lora()
            lora_rank = lora.rank
            known = LORA_TARGETS[arch.family]
            unknown = [x for x in lora.targets if x not in known]
            if unknown or not lora.targets:
                raise InputError(f"LoRA targets {unknown or '[]'} match no {arch.family} linear "
                                 f"layer; choose from {', '.join(known)}",
                                 key="training.lora.targets")
            targets = set(lora.targets)
            mods = [Module(m.path, m.kind, m.in_features, m.out_features, m.bias, m.block,
                           lora=m.leaf in targets and m.path != "lm_head") for m in mods]
        params = [p for m in mods for p in module_params(
            m, peft=t.finetune != "full", finetune=t.finetune, lora_rank=lora_rank)]
        return Job(name=cfg.name, arch=arch, generic_layers=tuple(cfg.layers or ()), training=t,
                   micro_batch=micro_batch or t.micro_batch, seq_len=seq_len or t.seq_len,
                   grad_accum=grad_accum or t.grad_accum, modules=tuple(mods), params=params,
                   recipe=resolve_recipe(t))

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
    def grad_bytes(self) -> int:
        """Bytes per weight and gradient element of the trainable weights: fp32 under mixed
        precision (PyTorch AMP and FSDP keep fp32 master weights, so .grad is fp32) and fp32
        training, bf16 under pure-bf16 training."""
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


def _default_lora() -> LoraConfig:
    return LoraConfig()
