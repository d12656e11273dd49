"""A model's shape and its parameters, laid out as Hugging Face and PEFT register them.

``Arch`` is a transformer's shape with its family's defaults applied (Llama, GPT-2, MPT; Qwen2
is the Llama layout with q/k/v biases; the encoder BERT); ``transformer_modules`` lists the
modules that own parameters in registration order (LlamaForCausalLM, GPT2LMHeadModel,
MPTForCausalLM, BertForQuestionAnswering), ``generic_modules`` those of a generic workload
(``layers:``, a list of layers with given parameters and FLOPs), and ``module_params`` the
tensors each module registers (``ParamTensor``), under PEFT's names and order where LoRA or
QLoRA wraps it (``get_peft_model``). Shapes only: dtypes come from the training recipe.

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

from dataclasses import dataclass

from simulator.errors import InputError, quoted
from simulator.inputs.schema import GenericLayer, ModelConfig
from simulator.job.modules import PEFT_PREFIX, Module, ModuleKind, ParamTensor
from simulator.job.moe import MoeShape
from simulator.job.vision import VisionShape

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


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention's widths (DeepseekV2Attention)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    head_size: int = 0  # each head's width (0: hidden / heads)
    qk_norm: bool = False  # Qwen3's q_norm and k_norm (RMSNorm of head_dim)
    moe: MoeShape | None = None  # experts in place of the MLP (job/moe.py)
    mla: MlaShape | None = None  # DeepSeek's latent attention in place of q/k/v
    fused_projections: bool = False  # Phi-3's qkv_proj and gate_up_proj
    sandwich_norm: bool = False  # Gemma 2/3: norms after attention and around the MLP
    attention_softcap: float | None = None  # Gemma 2: cap * tanh(scores / cap)
    logit_softcap: float | None = None  # Gemma 2: cap * tanh(logits / cap)
    sliding_window: int | None = None  # local attention's window, tokens
    local_layers: tuple[int, ...] = ()  # the blocks that attend locally
    vision: VisionShape | None = None  # a vision-language model's image encoder (job/vision.py)
    attention_sinks: bool = False  # gpt-oss: a learned softmax logit per head

    @property
    def gelu(self) -> str:
        """How the MLP's GELU runs eagerly: GPT-2's is transformers' NewGELUActivation, written
        op by op ("python"); the others call one kernel ("native")."""
        return "python" if self.family == "gpt2" else "native"

    @property
    def encoder(self) -> bool:
        """Bidirectional (no causal mask) with a task head, not a decoder with an LM head."""
        return self.family in ENCODERS

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """q_proj's width: heads x head_dim (MLA: heads x the q/k head width)."""
        if self.mla is not None:
            return self.heads * self.mla.qk_head_dim
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        if self.mla is not None:  # kv_b_proj gives every head its own k and v
            return self.heads * self.mla.qk_head_dim
        return self.kv_heads * self.head_dim

    @property
    def attn_dim(self) -> int:
        """The width the attention core works on per token: heads x head_dim; under MLA the
        mean of the q/k and v head widths (its two matmuls, QK^T over qk_head_dim and PV over
        v_head_dim, cost as two of that width)."""
        if self.mla is not None:
            return self.heads * (self.mla.qk_head_dim + self.mla.v_head_dim) // 2
        return self.q_dim

    def window(self, block: int) -> int | None:
        """The attention window of a block (None: the whole sequence)."""
        return self.sliding_window if block in self.local_layers else None

    def is_moe(self, block: int) -> bool:
        """Whether a block's MLP is a mixture of experts."""
        return self.moe is not None and 0 <= block < self.layers and \
            block not in self.moe.dense_layers

    @staticmethod
    def from_model(m: ModelConfig) -> Arch:
        d = _FAMILY_DEFAULTS.get(m.family)
        if d is None:
            raise InputError(f"unknown model family {quoted(m.family)}; known: "
                             f"{', '.join(_FAMILY_DEFAULTS)}",
                             key="model.family")
        positions = m.positions or str(d["positions"])
        if positions not in _ALLOWED_POSITIONS[m.family]:
            raise InputError(f"{m.family} models use {sorted(_ALLOWED_POSITIONS[m.family])} "
                             f"positions, got {quoted(positions)}", key="model.positions")
        bias = bool(d["bias"]) if m.bias is None else m.bias
        return Arch(
            family=m.family, layers=m.layers, hidden=m.hidden, heads=m.heads,
            kv_heads=m.kv_heads or m.heads, ffn_hidden=m.ffn_hidden or 4 * m.hidden,
            vocab=m.vocab, norm=m.norm or str(d["norm"]), mlp=m.mlp or str(d["mlp"]),
            bias=bias, qkv_bias=bias if m.qkv_bias is None else m.qkv_bias,
            positions=positions, max_positions=m.max_positions or 1024,
            tied=bool(d["tie"]) if m.tie_embeddings is None else m.tie_embeddings,
            head_size=m.head_dim or 0, qk_norm=m.qk_norm,
            moe=None if m.moe is None else MoeShape.of(m.moe),
            mla=None if m.mla is None else MlaShape(m.mla.q_lora_rank, m.mla.kv_lora_rank,
                                                   m.mla.qk_nope_head_dim,
                                                   m.mla.qk_rope_head_dim, m.mla.v_head_dim),
            fused_projections=m.fused_projections, sandwich_norm=m.sandwich_norm,
            attention_softcap=m.attention_softcap, logit_softcap=m.logit_softcap,
            sliding_window=m.sliding_window, local_layers=tuple(sorted(set(m.local_layers))),
            vision=None if m.vision is None else VisionShape.of(m.vision),
            attention_sinks=m.attention_sinks,
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
        if a.vision is not None:  # LlavaForConditionalGeneration: vision_tower, projector
            mods += a.vision.modules(h)
        add("model.embed_tokens", "embedding", a.vocab, h, False, -1)
        for b in range(L):
            p = f"model.layers.{b}"
            mods += _attention(a, f"{p}.self_attn", b)
            if a.is_moe(b):
                assert a.moe is not None
                mods += a.moe.modules(p, h, a.bias, b)
            elif a.fused_projections:  # Phi3MLP: gate_up_proj, down_proj
                add(f"{p}.mlp.gate_up_proj", "linear", h, 2 * f, a.bias, b)
                add(f"{p}.mlp.down_proj", "linear", f, h, a.bias, b)
            else:
                add(f"{p}.mlp.gate_proj", "linear", h, f, a.bias, b)
                add(f"{p}.mlp.up_proj", "linear", h, f, a.bias, b)
                add(f"{p}.mlp.down_proj", "linear", f, h, a.bias, b)
            add(f"{p}.input_layernorm", "norm", h, h, norm_bias, b)
            add(f"{p}.post_attention_layernorm", "norm", h, h, norm_bias, b)
            if a.sandwich_norm:  # Gemma2DecoderLayer
                add(f"{p}.pre_feedforward_layernorm", "norm", h, h, norm_bias, b)
                add(f"{p}.post_feedforward_layernorm", "norm", h, h, norm_bias, b)
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


def _attention(a: Arch, p: str, b: int) -> list[Module]:
    """A Llama-layout block's attention: q/k/v/o (LlamaAttention; Qwen3Attention adds q_norm
    and k_norm after o_proj, GptOssAttention its sinks), or DeepseekV2Attention's latent
    projections (q_proj, or q_a_proj, q_a_layernorm, q_b_proj; kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj; o_proj)."""
    h, m = a.hidden, a.mla
    if a.fused_projections:  # Phi3Attention: one qkv_proj, then o_proj
        return [Module(f"{p}.qkv_proj", "linear", h, a.q_dim + 2 * a.kv_dim, a.qkv_bias, b),
                Module(f"{p}.o_proj", "linear", a.q_dim, h, a.bias, b)]
    if m is None:
        mods = [Module(f"{p}.q_proj", "linear", h, a.q_dim, a.qkv_bias, b),
                Module(f"{p}.k_proj", "linear", h, a.kv_dim, a.qkv_bias, b),
                Module(f"{p}.v_proj", "linear", h, a.kv_dim, a.qkv_bias, b),
                Module(f"{p}.o_proj", "linear", a.q_dim, h, a.bias, b)]
        if a.qk_norm:
            mods += [Module(f"{p}.q_norm", "norm", a.head_dim, a.head_dim, False, b),
                     Module(f"{p}.k_norm", "norm", a.head_dim, a.head_dim, False, b)]
        if a.attention_sinks:  # GptOssAttention.sinks, one logit per head (here .sinks.weight)
            mods.append(Module(f"{p}.sinks", "norm", a.heads, a.heads, False, b))
        return mods
    if m.q_lora_rank is None:
        mods = [Module(f"{p}.q_proj", "linear", h, a.q_dim, False, b)]
    else:
        mods = [Module(f"{p}.q_a_proj", "linear", h, m.q_lora_rank, a.bias, b),
                Module(f"{p}.q_a_layernorm", "norm", m.q_lora_rank, m.q_lora_rank, False, b),
                Module(f"{p}.q_b_proj", "linear", m.q_lora_rank, a.q_dim, False, b)]
    return mods + [
        Module(f"{p}.kv_a_proj_with_mqa", "linear", h, m.kv_lora_rank + m.qk_rope_head_dim,
               a.bias, b),
        Module(f"{p}.kv_a_layernorm", "norm", m.kv_lora_rank, m.kv_lora_rank, False, b),
        Module(f"{p}.kv_b_proj", "linear", m.kv_lora_rank,
               a.heads * (m.qk_nope_head_dim + m.v_head_dim), False, b),
        Module(f"{p}.o_proj", "linear", a.heads * m.v_head_dim, h, a.bias, b)]


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
