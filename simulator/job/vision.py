"""A vision-language model's image encoder: a ViT before the language model, frozen, and the
projector that maps its features into the language model's embedding space.

Parameters as transformers registers them (``vision_tower.``, then ``multi_modal_projector.``
for LLaVA; ``visual.`` for Qwen2-VL):
- clip (LlavaForConditionalGeneration: CLIPVisionModel, models/clip/modeling_clip.py):
  ``embeddings`` (class_embedding, a bias-free Conv2d patch embedding, a position embedding of
  patches + 1 rows), ``pre_layrnorm``, per layer ``self_attn.k_proj / v_proj / q_proj /
  out_proj`` (with biases), ``layer_norm1``, ``mlp.fc1 / fc2``, ``layer_norm2``, then
  ``post_layernorm``; LlavaMultiModalProjector ``linear_1`` (vision -> text hidden) and
  ``linear_2`` (text -> text), both with biases.
- qwen2_vl (models/qwen2_vl/modeling_qwen2_vl.py Qwen2VisionTransformerPretrainedModel):
  ``patch_embed.proj`` (a bias-free Conv3d over 2 frames of 14 x 14 patches), per block
  ``norm1``, ``norm2``, ``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2`` (biases, mlp_ratio
  4), and the PatchMerger (``ln_q``, ``mlp.0`` of 4 x the width, ``mlp.2`` to the LM's hidden):
  every 2 x 2 patches become one language-model token.

Compute, per micro-batch: each image's patches through every layer (the six GEMMs, a
bidirectional flash attention over the image's patches, the norms, GELU and residual adds as
the eager regime runs them), then the projector; the encoder is frozen (no backward through
it: the images are inputs), the projector trains under a full fine-tune. The language model's
``seq_len`` includes the image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.job import attention, eager
from simulator.job.kernels import BlockShape, Kernel, pointwise
from simulator.job.modules import Module

if TYPE_CHECKING:
    from simulator.inputs.schema import VisionConfig
    from simulator.job.transformer_ops import Builder


@dataclass(frozen=True)
class VisionShape:
    layers: int
    hidden: int
    heads: int
    ffn: int
    patch: int
    image_size: int
    channels: int = 3
    layout: str = "clip"
    projector_hidden: int = 0
    images: int = 1

    @staticmethod
    def of(cfg: VisionConfig) -> VisionShape:
        return VisionShape(cfg.layers, cfg.hidden, cfg.heads, cfg.ffn_hidden, cfg.patch,
                           cfg.image_size, cfg.channels, cfg.layout, cfg.projector_hidden,
                           cfg.images_per_sample)

    @property
    def patches(self) -> int:
        """Patches of one image the encoder runs on (CLIP adds its class token)."""
        grid = (self.image_size // self.patch) ** 2
        return grid + 1 if self.layout == "clip" else grid

    @property
    def lm_tokens(self) -> int:
        """Language-model tokens one image becomes (Qwen2-VL merges 2 x 2 patches)."""
        return self.patches - 1 if self.layout == "clip" else self.patches // 4

    def modules(self, text_hidden: int) -> list[Module]:
        h, f, c, p = self.hidden, self.ffn, self.channels, self.patch
        mods: list[Module] = []

        def add(path: str, kind: str, i: int, o: int, bias: bool) -> None:
            mods.append(Module(path, kind, i, o, bias, -1))  # type: ignore[arg-type]

        if self.layout == "clip":
            base = "vision_tower.vision_model"
            add(f"{base}.embeddings.class_embedding", "norm", h, h, False)
            add(f"{base}.embeddings.patch_embedding", "linear", c * p * p, h, False)
            add(f"{base}.embeddings.position_embedding", "embedding", self.patches, h, False)
            add(f"{base}.pre_layrnorm", "norm", h, h, True)
            for i in range(self.layers):
                e = f"{base}.encoder.layers.{i}"
                for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
                    add(f"{e}.self_attn.{name}", "linear", h, h, True)
                add(f"{e}.layer_norm1", "norm", h, h, True)
                add(f"{e}.mlp.fc1", "linear", h, f, True)
                add(f"{e}.mlp.fc2", "linear", f, h, True)
                add(f"{e}.layer_norm2", "norm", h, h, True)
            add(f"{base}.post_layernorm", "norm", h, h, True)
            out = self.projector_hidden or text_hidden
            add("multi_modal_projector.linear_1", "linear", h, out, True)
            add("multi_modal_projector.linear_2", "linear", out, text_hidden, True)
            return mods
        add("visual.patch_embed.proj", "linear", c * 2 * p * p, h, False)  # Conv3d, 2 frames
        for i in range(self.layers):
            e = f"visual.blocks.{i}"
            add(f"{e}.norm1", "norm", h, h, True)
            add(f"{e}.norm2", "norm", h, h, True)
            add(f"{e}.attn.qkv", "linear", h, 3 * h, True)
            add(f"{e}.attn.proj", "linear", h, h, True)
            add(f"{e}.mlp.fc1", "linear", h, f, True)
            add(f"{e}.mlp.fc2", "linear", f, h, True)
        add("visual.merger.ln_q", "norm", h, h, True)
        add("visual.merger.mlp.0", "linear", 4 * h, 4 * h, True)
        add("visual.merger.mlp.2", "linear", 4 * h, text_hidden, True)
        return mods


def is_vision(mod: Module) -> bool:
    return mod.path.startswith(("vision_tower.", "multi_modal_projector.", "visual."))


def projector(mod: Module) -> bool:
    return mod.path.startswith(("multi_modal_projector.", "visual.merger."))


def forward(bld: Builder, mods: list[Module]) -> list[Kernel]:
    """The encoder over a micro-batch's images, then the projector."""
    v = bld.arch.vision
    assert v is not None
    a = bld.a
    images = bld.job.micro_batch * v.images
    rows = images * v.patches
    shape = BlockShape(rows, v.hidden, v.hidden, v.ffn, v.heads, a)
    out: list[Kernel] = []
    encoder = [m for m in mods if not projector(m) and m.kind == "linear"]
    patch, layers = encoder[0], encoder[1:]
    out += bld.linears_fwd([patch], images * (v.image_size // v.patch) ** 2)
    per_layer = len(layers) // v.layers
    norm = eager.norm(shape, "layernorm").forward
    gelu = eager.activation(shape, "gelu").forward
    residual = eager.residual(shape, dropout=False).forward
    for i in range(v.layers):
        linears = layers[i * per_layer:(i + 1) * per_layer]
        out += list(norm) + bld.linears_fwd(linears[:-2], rows)
        out.append(attention.flash(images, v.patches, v.hidden, v.hidden, a, causal=False,
                                   backward=False, version=bld.flash_version))
        out += list(residual) + list(norm) + bld.linears_fwd(linears[-2:-1], rows)
        out += list(gelu) + bld.linears_fwd(linears[-1:], rows) + list(residual)
    merged = images * v.lm_tokens
    proj = [m for m in mods if projector(m) and m.kind == "linear"]
    out += bld.linears_fwd(proj, merged)
    # the image features written into the text embeddings (masked_scatter)
    return out + [pointwise("masked_scatter_image_features", merged * bld.arch.hidden,
                            reads=a, writes=a)]


def backward(bld: Builder, mods: list[Module]) -> list[Kernel]:
    """Only a trained projector's weight gradients: nothing flows into the images."""
    v = bld.arch.vision
    assert v is not None
    if bld.job.finetune != "full":
        return []
    merged = bld.job.micro_batch * v.images * v.lm_tokens
    proj = [m for m in mods if projector(m) and m.kind == "linear"]
    return bld.linears_bwd(proj, merged)
