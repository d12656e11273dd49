"""A diffusion UNet (diffusers ``UNet2DConditionModel``: Stable Diffusion 1.x/2.x, SDXL): its
parameters as diffusers registers them, and each block's kernels as PyTorch and cuDNN run them.

Layout (diffusers ``models/unets/unet_2d_condition.py``, ``unet_2d_blocks.py``,
``resnet.py``, ``transformers/transformer_2d.py``, ``attention.py``):
- ``conv_in`` (3x3), ``time_embedding.linear_1/linear_2`` (block_out_channels[0] -> 4x), SDXL's
  ``add_embedding`` (projection_class_embeddings_input_dim -> time width);
- down blocks: ``attentions`` then ``resnets`` (layers_per_block each; CrossAttnDownBlock2D),
  then ``downsamplers.0.conv`` (3x3, stride 2) but in the last; DownBlock2D has no attentions;
- ``mid_block``: attentions (one Transformer2DModel), resnets (two);
- up blocks: layers_per_block + 1 resnets over the channels concatenated with the skip, their
  attentions, ``upsamplers.0.conv`` (nearest 2x, then 3x3) but in the last;
- ``conv_norm_out`` (GroupNorm), ``conv_out`` (3x3).
ResnetBlock2D: norm1 (GroupNorm), conv1 (3x3), time_emb_proj, norm2, conv2, conv_shortcut
(1x1) where the channels change. Transformer2DModel: norm (GroupNorm), proj_in (1x1 conv, or
Linear with use_linear_projection), transformer_blocks (BasicTransformerBlock: norm1, attn1
(to_q, to_k, to_v without bias, to_out.0), norm2, attn2 over the text tokens (to_k, to_v from
cross_attention_dim), norm3, ff.net.0.proj (GEGLU: 8 x width) and ff.net.2), proj_out.
``attention_head_dim`` is the number of heads (diffusers' own note: the name is kept for
compatibility), so a head is width / heads wide (64 in SD 1.5 and SDXL).

Kernels per micro-batch (b images at the latent resolution, a bytes per element):
- a convolution is cuDNN's implicit GEMM: M = b x output positions, N = output channels,
  K = input channels x kernel area (NVIDIA, "Convolutional Layers User's Guide": implicit GEMM),
  timed as a GEMM of that shape on the tensor cores (compute.py: tiles and waves of the card);
  under fp32 training cuDNN runs it in TF32 on Ampere and later (PyTorch's default
  ``torch.backends.cudnn.allow_tf32 = True``), the Linears on CUDA cores (``matmul.allow_tf32``
  False since 1.12); backward is the data-gradient and, for a trained weight, the
  weight-gradient implicit GEMM;
- GroupNorm (reads its input twice for the statistics and the normalisation, writes once),
  SiLU, nearest upsampling, the skip concatenation, residual adds: memory-bound;
- attention: self-attention over the level's positions (H x W tokens), cross-attention over
  the text tokens (77), one FlashAttention kernel each (SDPA), heads of 64.
Saved for backward (no checkpointing): each norm's and activation's input and each GEMM's
input, attention's q, k, v, output and log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from simulator.job.kernels import FP32, Kernel, gemm, pointwise
from simulator.job.modules import Module

if TYPE_CHECKING:
    from simulator.inputs.schema import GenericLayer, UNetConfig
    from simulator.job.workload import Job

TEXT_TOKENS = 77  # CLIP's context: the text encoders' hidden states the UNet attends to
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
                "ff.net.2", "conv1", "conv2", "conv_shortcut", "time_emb_proj")


@dataclass(frozen=True)
class UNetShape:
    in_channels: int
    out_channels: int
    channels: tuple[int, ...]
    layers_per_block: int
    down: tuple[str, ...]
    up: tuple[str, ...]
    heads: tuple[int, ...]
    transformer_layers: tuple[int, ...]
    cross_dim: int
    groups: int
    linear_projection: bool
    addition_dim: int
    latent: int  # latent side (image side / 8)
    text_tokens: int = TEXT_TOKENS

    @staticmethod
    def of(cfg: UNetConfig) -> UNetShape:
        n = len(cfg.block_out_channels)

        def per_block(values: list[int]) -> tuple[int, ...]:
            return tuple(values) if len(values) == n else tuple(values[:1]) * n

        return UNetShape(cfg.in_channels, cfg.out_channels, tuple(cfg.block_out_channels),
                         cfg.layers_per_block, tuple(cfg.down_block_types),
                         tuple(cfg.up_block_types), per_block(cfg.heads),
                         per_block(cfg.transformer_layers), cfg.cross_attention_dim,
                         cfg.norm_groups, cfg.linear_projection, cfg.addition_embed_dim,
                         cfg.image_size // 8, cfg.text_tokens)

    @property
    def time_dim(self) -> int:
        return 4 * self.channels[0]

    @property
    def blocks(self) -> list[str]:
        """The block names, forward order: the FSDP units and the ops' labels."""
        n = len(self.channels)
        return (["conv_in"] + [f"down_blocks.{i}" for i in range(n)] + ["mid_block"]
                + [f"up_blocks.{i}" for i in range(n)] + ["conv_out"])

    # ---- the structure: what each block holds, at which resolution --------------------------
    def layout(self) -> list[list[tuple[str, str, dict[str, int]]]]:
        """Per block, its parts in registration order: (path, kind, sizes); kinds: conv,
        linear, norm, resnet, transformer, upsample, concat."""
        c0, ch, n = self.channels[0], self.channels, len(self.channels)
        side = self.latent
        first: list[tuple[str, str, dict[str, int]]] = [
            ("conv_in", "conv", {"i": self.in_channels, "o": c0, "k": 3, "s": side}),
            ("time_embedding.linear_1", "linear", {"i": c0, "o": self.time_dim, "m": 1}),
            ("time_embedding.linear_2", "linear", {"i": self.time_dim, "o": self.time_dim,
                                                   "m": 1})]
        if self.addition_dim:  # SDXL text_time: add_embedding
            first += [("add_embedding.linear_1", "linear", {"i": self.addition_dim,
                                                            "o": self.time_dim, "m": 1}),
                      ("add_embedding.linear_2", "linear", {"i": self.time_dim,
                                                            "o": self.time_dim, "m": 1})]
        out = [first]
        skips = [c0]
        cin = c0
        for i, kind in enumerate(self.down):
            p, cout = f"down_blocks.{i}", ch[i]
            attn = [(f"{p}.attentions.{j}", "transformer",
                     {"c": cout, "s": side, "heads": self.heads[i],
                      "layers": self.transformer_layers[i]})
                    for j in range(self.layers_per_block)] if "CrossAttn" in kind else []
            res = [(f"{p}.resnets.{j}", "resnet", {"i": cin if j == 0 else cout, "o": cout,
                                                    "s": side})
                   for j in range(self.layers_per_block)]
            parts = attn + res  # registration order; forward alternates resnet, attention
            skips += [cout] * self.layers_per_block
            if i < n - 1:
                parts.append((f"{p}.downsamplers.0.conv", "conv",
                              {"i": cout, "o": cout, "k": 3, "s": side // 2, "stride": 2}))
                side //= 2
                skips.append(cout)
            cin = cout
            out.append(parts)
        mid = ch[-1]
        out.append([("mid_block.attentions.0", "transformer",
                     {"c": mid, "s": side, "heads": self.heads[-1],
                      "layers": self.transformer_layers[-1]}),
                    ("mid_block.resnets.0", "resnet", {"i": mid, "o": mid, "s": side}),
                    ("mid_block.resnets.1", "resnet", {"i": mid, "o": mid, "s": side})])
        rev, rheads, rlayers = ch[::-1], self.heads[::-1], self.transformer_layers[::-1]
        prev = rev[0]
        for i, kind in enumerate(self.up):
            p, cout = f"up_blocks.{i}", rev[i]
            res = []
            for j in range(self.layers_per_block + 1):
                skip = skips.pop()
                res.append((f"{p}.resnets.{j}", "resnet",
                            {"i": (prev if j == 0 else cout) + skip, "o": cout, "s": side,
                             "cat": 1}))
            attn = [(f"{p}.attentions.{j}", "transformer",
                     {"c": cout, "s": side, "heads": rheads[i], "layers": rlayers[i]})
                    for j in range(self.layers_per_block + 1)] if "CrossAttn" in kind else []
            parts = attn + res
            if i < n - 1:
                side *= 2
                parts.append((f"{p}.upsamplers.0.conv", "upsample",
                              {"i": cout, "o": cout, "k": 3, "s": side}))
            prev = cout
            out.append(parts)
        out.append([("conv_norm_out", "norm", {"c": c0, "s": self.latent}),
                    ("conv_out", "conv", {"i": c0, "o": self.out_channels, "k": 3,
                                          "s": self.latent})])
        return out

    def modules(self) -> list[Module]:
        """Every parameter-owning module, in registration order, block by block."""
        mods: list[Module] = []
        for b, parts in enumerate(self.layout()):
            for path, kind, d in parts:
                mods += _modules(self, path, kind, d, b, Module)
        return mods


def _modules(u: UNetShape, path: str, kind: str, d: dict[str, int], b: int,
             module: type) -> list[Module]:
    if kind in ("conv", "upsample"):
        return [module(path, "linear", d["i"] * d["k"] ** 2, d["o"], True, b)]
    if kind == "linear":
        return [module(path, "linear", d["i"], d["o"], True, b)]
    if kind == "norm":
        return [module(path, "norm", d["c"], d["c"], True, b)]
    if kind == "resnet":
        i, o = d["i"], d["o"]
        mods = [module(f"{path}.norm1", "norm", i, i, True, b),
                module(f"{path}.conv1", "linear", 9 * i, o, True, b),
                module(f"{path}.time_emb_proj", "linear", u.time_dim, o, True, b),
                module(f"{path}.norm2", "norm", o, o, True, b),
                module(f"{path}.conv2", "linear", 9 * o, o, True, b)]
        if i != o:
            mods.append(module(f"{path}.conv_shortcut", "linear", i, o, True, b))
        return mods
    c = d["c"]
    mods = [module(f"{path}.norm", "norm", c, c, True, b),
            module(f"{path}.proj_in", "linear", c, c, True, b)]
    for t in range(d["layers"]):
        p = f"{path}.transformer_blocks.{t}"
        mods += [module(f"{p}.norm1", "norm", c, c, True, b),
                 module(f"{p}.attn1.to_q", "linear", c, c, False, b),
                 module(f"{p}.attn1.to_k", "linear", c, c, False, b),
                 module(f"{p}.attn1.to_v", "linear", c, c, False, b),
                 module(f"{p}.attn1.to_out.0", "linear", c, c, True, b),
                 module(f"{p}.norm2", "norm", c, c, True, b),
                 module(f"{p}.attn2.to_q", "linear", c, c, False, b),
                 module(f"{p}.attn2.to_k", "linear", u.cross_dim, c, False, b),
                 module(f"{p}.attn2.to_v", "linear", u.cross_dim, c, False, b),
                 module(f"{p}.attn2.to_out.0", "linear", c, c, True, b),
                 module(f"{p}.norm3", "norm", c, c, True, b),
                 module(f"{p}.ff.net.0.proj", "linear", c, 8 * c, True, b),
                 module(f"{p}.ff.net.2", "linear", 4 * c, c, True, b)]
    return mods + [module(f"{path}.proj_out", "linear", c, c, True, b)]


# ---- kernels ---------------------------------------------------------------------------------
@dataclass
class _Kernels:
    """One block's forward and backward kernels and what it saves, built part by part."""

    job: Job
    trained: set[str]  # module paths whose weights get a gradient
    lora: set[str]  # module paths with LoRA adapters
    forward: list[Kernel]
    backward: list[Kernel]
    saved: float = 0.0  # bytes per image

    @property
    def a(self) -> int:
        return self.job.activation_bytes

    def gemm(self, path: str, m: int, n: int, k: int, *, conv: bool = False) -> None:
        """A GEMM (a convolution's implicit GEMM when ``conv``), its backward, its saved
        input (when its weight trains or it carries LoRA)."""
        a, r = self.a, self.job.lora_rank
        tf32 = conv and a == FP32  # cuDNN's TF32 (Ampere+: compute.py decides the rate)
        name = "implicit_gemm" if conv else "mm"
        fwd = replace(gemm(m, n, k, a), name=name + ("_tf32" if tf32 else ""))
        self.forward.append(fwd)
        self.backward.append(replace(fwd, name=name + "_dgrad" + ("_tf32" if tf32 else "")))
        if path in self.trained:
            self.backward.append(replace(gemm(n, k, m, a), weight_grad=True,
                                         name=name + "_wgrad" + ("_tf32" if tf32 else "")))
        if path in self.lora:  # PEFT's LoRA on the layer: down, up, scaled add
            self.forward += [gemm(m, r, k, a), gemm(m, n, r, a),
                             pointwise("lora_add", m * n, reads=2 * a, writes=a)]
            self.backward += [gemm(m, r, n, a), gemm(r, n, m, a), gemm(r, k, m, a),
                              gemm(m, k, r, a)]
        if path in self.trained or path in self.lora:
            self.saved += m * k * a / self.job.micro_batch

    def memory(self, name: str, n: float, reads: float, writes: float, *,
               back_reads: float, back_writes: float, saves: float = 0.0) -> None:
        self.forward.append(pointwise(name, n, reads=reads, writes=writes))
        self.backward.append(pointwise(f"{name}_backward", n, reads=back_reads,
                                       writes=back_writes))
        self.saved += n * saves / self.job.micro_batch

    def group_norm(self, n: float) -> None:
        """native_group_norm: statistics then normalisation (two reads, one write); its
        backward reads the input and the output gradient twice (the sums, then dx). Under
        autocast it runs in fp32 (torch/csrc/autograd autocast_mode.cpp lists group_norm among
        the fp32 ops): its 16-bit input is cast up, and its fp32 output down again before the
        next convolution."""
        a = self.a
        f = FP32 if self.job.recipe.autocast else a
        if f != a:
            self.memory("to_fp32", n, a, f, back_reads=f, back_writes=a)
        self.memory("group_norm", n, 2 * f, f, back_reads=4 * f, back_writes=f, saves=f)
        if f != a:
            self.memory("to_dtype", n, f, a, back_reads=a, back_writes=f)

    def silu(self, n: float) -> None:
        a = self.a
        self.memory("silu", n, a, a, back_reads=2 * a, back_writes=a, saves=a)

    def add(self, n: float) -> None:
        a = self.a
        self.memory("add", n, 2 * a, a, back_reads=a, back_writes=a)

    def attention(self, images: int, q: int, kv: int, width: int) -> None:
        """One SDPA FlashAttention call: images x heads rows of q positions over kv."""
        a = self.a
        flops = 4.0 * images * q * kv * width
        io = (2 * images * q * width + 2 * images * kv * width) * a
        self.forward.append(Kernel("attention_fwd", flops, io, name="flash_attention_forward"))
        self.backward.append(Kernel("attention_bwd", 2.5 * flops, 2 * io,
                                    name="flash_attention_backward"))
        self.saved += (2 * q * width + 2 * kv * width) * a + FP32 * q * width // 64


def block_kernels(job: Job, block: int) -> tuple[list[Kernel], list[Kernel], float]:
    """(forward kernels, backward kernels in running order, saved bytes per image) of one
    block over one micro-batch."""
    u = job.unet
    assert u is not None
    trained = set()
    for i in job.block_params(block):  # a module trains when its own weight does
        p = job.params[i]
        if p.trainable and ".lora_" not in p.name:
            trained.add(p.name.removeprefix("base_model.model.").rsplit(".", 1)[0]
                        .removesuffix(".base_layer"))
    lora = {m.path for m in job.modules if m.block == block and m.lora}
    k = _Kernels(job, trained, lora, [], [])
    b = job.micro_batch
    for path, kind, d in u.layout()[block]:
        _part(k, u, path, kind, d, b)
    k.backward.reverse()
    return k.forward, k.backward, k.saved


def _part(k: _Kernels, u: UNetShape, path: str, kind: str, d: dict[str, int], b: int) -> None:
    a = k.a
    if kind == "linear":
        k.gemm(path, b * d["m"], d["o"], d["i"])
        return
    if kind == "norm":
        n = b * d["s"] ** 2 * d["c"]
        k.group_norm(n)
        k.silu(n)
        return
    if kind in ("conv", "upsample"):
        side = d["s"]
        if kind == "upsample":  # F.interpolate(nearest, 2x): read n, write 4n
            n = b * (side // 2) ** 2 * d["i"]
            k.memory("upsample_nearest", n, a, 4 * a, back_reads=4 * a, back_writes=a)
        k.gemm(path, b * side * side, d["o"], d["i"] * d["k"] ** 2, conv=True)
        return
    side = d["s"]
    m = b * side * side
    if kind == "resnet":
        i, o = d["i"], d["o"]
        if d.get("cat"):  # torch.cat of the hidden states with the down path's skip
            k.memory("cat_skip", m * i, a, a, back_reads=a, back_writes=a)
        k.group_norm(m * i)
        k.silu(m * i)
        k.gemm(f"{path}.conv1", m, o, 9 * i, conv=True)
        k.gemm(f"{path}.time_emb_proj", b, o, u.time_dim)
        k.add(m * o)  # + temb[:, :, None, None]
        k.group_norm(m * o)
        k.silu(m * o)
        k.gemm(f"{path}.conv2", m, o, 9 * o, conv=True)
        if i != o:
            k.gemm(f"{path}.conv_shortcut", m, o, i, conv=True)
        k.add(m * o)
        return
    c = d["c"]
    k.group_norm(m * c)
    k.gemm(f"{path}.proj_in", m, c, c, conv=not u.linear_projection)
    for t in range(d["layers"]):
        p = f"{path}.transformer_blocks.{t}"
        k.memory("layer_norm", m * c, a, a, back_reads=2 * a, back_writes=a, saves=a)
        for name in ("to_q", "to_k", "to_v"):
            k.gemm(f"{p}.attn1.{name}", m, c, c)
        k.attention(b, side * side, side * side, c)
        k.gemm(f"{p}.attn1.to_out.0", m, c, c)
        k.add(m * c)
        k.memory("layer_norm", m * c, a, a, back_reads=2 * a, back_writes=a, saves=a)
        k.gemm(f"{p}.attn2.to_q", m, c, c)
        for name in ("to_k", "to_v"):
            k.gemm(f"{p}.attn2.{name}", b * u.text_tokens, c, u.cross_dim)
        k.attention(b, side * side, u.text_tokens, c)
        k.gemm(f"{p}.attn2.to_out.0", m, c, c)
        k.add(m * c)
        k.memory("layer_norm", m * c, a, a, back_reads=2 * a, back_writes=a, saves=a)
        k.gemm(f"{p}.ff.net.0.proj", m, 8 * c, c)
        # GEGLU: hidden, gate = proj(x).chunk(2); hidden * gelu(gate)
        k.memory("geglu", m * 4 * c, 2 * a, a, back_reads=3 * a, back_writes=2 * a,
                 saves=2 * a)
        k.gemm(f"{p}.ff.net.2", m, c, 4 * c)
        k.add(m * c)
    k.gemm(f"{path}.proj_out", m, c, c, conv=not u.linear_projection)
    k.add(m * c)


def generic_layers(job: Job) -> tuple[GenericLayer, ...]:
    """Each block as the generic layer the memory model and the strategies read: its
    parameters, its forward FLOPs and saved bytes per image, its tensors (DDP buckets)."""
    from simulator.inputs.schema import GenericLayer

    u = job.unet
    assert u is not None
    out = []
    one = replace(job, micro_batch=1)
    for b, name in enumerate(u.blocks):
        forward, _, saved = block_kernels(one, b)
        numels = [job.params[i].numel for i in job.block_params(b)]
        out.append(GenericLayer(name=name, params=sum(numels),
                                forward_flops_per_sample=sum(k.flops for k in forward
                                                             if k.kind != "memory"),
                                activation_bytes_per_sample=saved, tensors=len(numels),
                                tensor_numels=numels,
                                memory_bytes_per_sample=sum(k.bytes for k in forward
                                                            if k.kind == "memory")))
    return tuple(out)
