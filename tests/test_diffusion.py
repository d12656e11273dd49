"""Diffusion fine-tuning (job/diffusion.py, inputs/hf_diffusers.py): the UNet's parameters as
diffusers registers them, convolutions as cuDNN's implicit GEMMs at the rate the card runs
them, LoRA on the UNet, and the strategies over its blocks."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simulator import api
from simulator.catalog.gpus import gpu
from simulator.cli import main
from simulator.errors import InputError
from simulator.inputs import hf_config, peft_config
from simulator.job import compute
from simulator.job.kernels import FP32, gemm
from simulator.job.workload import Job

DIFFUSERS = Path(__file__).parent / "fixtures" / "diffusers"
LORA = str(Path(__file__).parent / "fixtures" / "peft" / "sdxl-unet-lora" /
           "adapter_config.json")
SDXL = f"hf:{DIFFUSERS / 'sdxl-unet'}"


def job(name: str, peft: str | None = None, **training: object) -> Job:
    workload = hf_config.load(f"hf:{DIFFUSERS / name}")
    if peft:
        workload = peft_config.apply(workload, peft)
    if training:
        workload = workload.with_training(**training)
    return Job.from_config(workload)


# (folder, exact count, published count, its rounding)
CARDS = [
    # runwayml/stable-diffusion-v1-5 unet: "859.52M" (diffusers' own count, printed by
    # UNet2DConditionModel.num_parameters(); the SD 1.x paper rounds it to 860M)
    ("sd15-unet", 859_520_964, 859.52e6, 0.005e6),
    # stabilityai/stable-diffusion-xl-base-1.0 unet: "2.6B" (SDXL report, Podell et al. 2023,
    # Table 1: 2.6B UNet parameters)
    ("sdxl-unet", 2_567_463_684, 2.6e9, 0.05e9),
]


@pytest.mark.parametrize(("name", "exact", "card", "digits"), CARDS)
def test_counts_match_the_published_ones(name: str, exact: int, card: float,
                                         digits: float) -> None:
    j = job(name)
    assert j.n_params == exact
    assert j.n_params == pytest.approx(card, abs=digits)
    assert j.seq_len == 1 and j.micro_batch == 16  # one image a sample; the script's batch


def test_modules_in_diffusers_registration_order() -> None:
    j = job("sdxl-unet")
    first = [m.path for m in j.modules[:5]]
    assert first == ["conv_in", "time_embedding.linear_1", "time_embedding.linear_2",
                     "add_embedding.linear_1", "add_embedding.linear_2"]
    paths = {m.path for m in j.modules}
    # SDXL: no attention in the first down block, ten transformer layers in the last
    assert not any(p.startswith("down_blocks.0.attentions") for p in paths)
    assert "down_blocks.2.attentions.1.transformer_blocks.9.attn2.to_k" in paths
    assert "down_blocks.2.attentions.1.transformer_blocks.10.attn2.to_k" not in paths
    to_k = next(m for m in j.modules if m.path.endswith("down_blocks.1.attentions.0."
                                                        "transformer_blocks.0.attn2.to_k"))
    assert (to_k.in_features, to_k.out_features, to_k.bias) == (2048, 640, False)


def test_a_convolution_is_its_implicit_gemm() -> None:
    """conv_in of SD 1.5 at 512 px over 16 images: M = 16 x 64 x 64 positions, N = 320
    output channels, K = 4 input channels x 3 x 3."""
    j = job("sd15-unet")
    forward = j.ops("forward")[0].kernels
    conv = next(k for k in forward if k.name.startswith("implicit_gemm"))
    assert conv.shape is not None and conv.shape[:3] == (16 * 64 * 64, 320, 4 * 9)
    assert conv.flops == 2 * 16 * 64 * 64 * 320 * 36
    # conv_in's weight trains in a full fine-tune: data and weight gradients in backward
    backward = [op for op in j.ops("backward") if op.name == "conv_in"][0].kernels
    names = [k.name for k in backward if k.kind == "gemm"]
    assert "implicit_gemm_dgrad" in names and "implicit_gemm_wgrad" in names


def test_forward_flops_per_image() -> None:
    """The UNet forward's multiply-adds at 1024 px (SDXL) and 512 px (SD 1.5): the usual
    quotes are ~6.7 and ~0.8 TFLOPs per image (2 x the MACs fvcore counts)."""
    for name, low, high in (("sdxl-unet", 6.4e12, 7.0e12), ("sd15-unet", 0.75e12, 0.85e12)):
        j = job(name, micro_batch=1)
        flops = sum(k.flops for op in j.ops("forward") for k in op.kernels)
        assert low < flops < high, name


def test_fp32_convolutions_run_in_tf32_from_ampere_only() -> None:
    """cuDNN's TF32 (torch.backends.cudnn.allow_tf32 defaults True): the tensor cores at half
    their 16-bit rate on Ampere+; Turing has no TF32, so FP32 CUDA cores."""
    shape = (65536, 640, 5760)
    plain = gemm(*shape, FP32)
    tf32 = replace(plain, name="implicit_gemm_tf32")
    half = gemm(*shape, 2)
    a100 = gpu("a100-sxm4-80gb")
    t_tf32 = compute.kernel_work_time(tf32, a100)
    # twice the 16-bit time, but for the fixed per-kernel cost
    assert t_tf32 == pytest.approx(2 * compute.kernel_work_time(half, a100), rel=0.01)
    assert t_tf32 < compute.kernel_work_time(plain, a100) / 3  # vs 19.5 TFLOPS of CUDA cores
    turing = gpu("rtx2080ti")
    assert compute.kernel_work_time(tf32, turing) == compute.kernel_work_time(plain, turing)
    j = job("sd15-unet", precision="fp32")
    names = {k.name for op in j.ops("forward") for k in op.kernels}
    assert "implicit_gemm_tf32" in names and "mm" in names  # the Linears stay fp32


def test_group_norm_runs_in_fp32_under_autocast() -> None:
    mixed = {k.name for op in job("sd15-unet").ops("forward") for k in op.kernels}
    pure = {k.name for op in job("sd15-unet", precision="fp32").ops("forward")
            for k in op.kernels}
    assert {"to_fp32", "group_norm", "to_dtype"} <= mixed
    assert "group_norm" in pure and "to_fp32" not in pure


def test_lora_on_the_attention_projections() -> None:
    """diffusers' train_text_to_image_lora.py: rank 4 on to_q, to_k, to_v, to_out.0. SD 1.5's
    adapter is 797,184 parameters: 3.19 MB in fp32, the "3.29 MB" file of Hugging Face's
    "Using LoRA for Efficient Stable Diffusion Fine-Tuning" (2023-01-26) with its tensors'
    names and headers."""
    j = job("sd15-unet", LORA)
    trainable = sum(p.numel for p in j.params if p.trainable)
    assert trainable == 797_184
    assert 4 * trainable == pytest.approx(3.29e6, rel=0.05)
    assert all(".lora_" in p.name for p in j.params if p.trainable)
    sdxl = job("sdxl-unet", LORA)
    assert sum(p.numel for p in sdxl.params if p.trainable) == 5_806_080
    # frozen convolutions still pass the gradient down, but compute no weight gradient
    backward = [k.name for op in sdxl.ops("backward") for k in op.kernels]
    assert "implicit_gemm_dgrad" in backward and "implicit_gemm_wgrad" not in backward


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_runs_under_the_strategies(strategy: str) -> None:
    spec = api.RunSpec(topology="4x5090", workload=SDXL, strategy=strategy, micro_batch=1,
                       peft=LORA)
    r = api.run(spec)
    assert 0.05 < r["step_time_s"] < 2.0
    assert r["samples_per_s"] == pytest.approx(4 / r["step_time_s"])
    assert r["tokens_per_step"] == 4  # a sample is one image


def test_full_fine_tune_of_sdxl_does_not_fit_a_32_gb_card() -> None:
    """fp32 weights, gradients and AdamW's two moments: 16 bytes x 2.57B = 38 GiB alone."""
    report = api.memory(api.RunSpec(topology="4x5090", workload=SDXL, micro_batch=1)).report
    assert not report.fits
    assert report.peak_bytes > 16 * 2_567_463_684


@pytest.mark.parametrize(("changes", "key", "words"), [
    ({"_class_name": "SD3Transformer2DModel"}, "_class_name", "diffusion transformers"),
    ({"_class_name": "FluxTransformer2DModel"}, "_class_name", "known: UNet2DConditionModel"),
    ({"down_block_types": ["AttnDownBlock2D", "CrossAttnDownBlock2D",
                           "CrossAttnDownBlock2D", "DownBlock2D"]},
     "down_block_types[0]", "known: DownBlock2D"),
    ({"class_embed_type": "timestep"}, "class_embed_type", "not modelled"),
    ({"transformer_layers_per_block": [1, 2]}, "transformer_layers_per_block",
     "4 of them"),
])
def test_what_is_not_modelled_is_one_line(tmp_path: Path, changes: dict, key: str,
                                          words: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((DIFFUSERS / "sd15-unet" / "config.json").read_text())
    data.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        hf_config.load(f"hf:{path}")
    line = str(err.value)
    assert "\n" not in line and key in line and words in line
    assert main(["memory", "-t", "4x5090", "-w", f"hf:{path}"]) == 2
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 1 and words in out[0]
