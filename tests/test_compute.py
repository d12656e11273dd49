"""Compute model: roofline scaling, GEMM waves, MFU, and published single-GPU throughputs."""

from dataclasses import replace

import pytest

from simulator.catalog.gpus import GPU, gpu
from simulator.inputs.config import load_workload
from simulator.job import compute
from simulator.job.kernels import gemm, memory
from simulator.job.ops import Kernel, Op
from simulator.job.workload import Job

A100 = gpu("a100-sxm4-80gb")


def busy(op: Op, g: GPU) -> float:
    """Op time without launch overhead."""
    return compute.op_time(op, g) - len(op.kernels) * compute.LAUNCH_OVERHEAD


def test_memory_bound_op_scales_with_bandwidth() -> None:
    op = Op.of("norm", 0, "forward", [memory(1e9, 1e6)])
    faster = replace(A100, memory_bandwidth=2 * A100.memory_bandwidth)
    assert busy(op, faster) == pytest.approx(busy(op, A100) / 2)
    assert busy(op, replace(A100, matmul_flops=10 * A100.matmul_flops)) == busy(op, A100)


def test_compute_bound_op_scales_with_flops() -> None:
    m, n, k = 128 * 108, 128 * 8, 8192  # whole waves of 128x128 tiles on 108 SMs
    op = Op.of("mlp", 0, "forward", [gemm(m, n, k, 2)])
    rate = compute.gemm_rate(m, n, k, A100)
    assert busy(op, A100) == pytest.approx(2 * m * n * k / rate)
    faster = replace(A100, plain_matmul_flops=2 * A100.plain_matmul_flops)
    assert busy(op, faster) == pytest.approx(busy(op, A100) / 2)
    assert busy(op, replace(A100, memory_bandwidth=10 * A100.memory_bandwidth)) == busy(op, A100)


@pytest.mark.parametrize("name", ["rtx4090", "rtx5090", "h100-sxm", "a100-pcie-80gb"])
def test_the_reference_gemm_runs_at_the_catalog_plain_rate(name: str) -> None:
    g = gpu(name)
    assert compute.gemm_rate(8192, 8192, 8192, g) == pytest.approx(g.plain_matmul_flops)


def test_unpublished_rate_uses_the_product_line_ratio() -> None:
    g = gpu("h100-pcie")
    assert g.measured_matmul_flops is None and g.plain_matmul_flops is None
    ratio = compute.plain_to_spec("datacenter")
    assert 0.65 < ratio < 0.85
    assert compute.matmul_rate(g) == pytest.approx(g.matmul_flops * ratio)
    assert 0.9 < compute.plain_to_spec("geforce") < 1.15  # GeForce cards boost past spec


def test_mamf_is_scaled_to_a_plain_matmul() -> None:
    h100 = replace(gpu("h100-sxm"), plain_matmul_flops=None)
    assert h100.measured_matmul_flops is not None
    assert compute.matmul_rate(h100) == pytest.approx(
        h100.measured_matmul_flops * 230 / 271.2)


def test_small_gemms_lose_to_wave_quantisation() -> None:
    assert compute.wave_efficiency(128 * 108, 128, 108) == 1.0
    assert compute.wave_efficiency(128 * 109, 128, 108) == pytest.approx(109 / 216)
    # a LoRA weight-gradient GEMM (rank 16 rows) fills few SMs
    assert compute.wave_efficiency(16, 4096, 108) < 0.3


def test_short_k_and_padded_tiles_cost_efficiency() -> None:
    full = compute.gemm_efficiency(4096, 4096, 4096, 128)
    # a rank-16 LoRA output pads its one 128-wide tile column: 1/8 of it is useful
    assert compute.gemm_efficiency(4096, 16, 4096, 128) < full / 7
    # a rank-16 reduction spends most of the k pipeline filling and draining it
    assert compute.gemm_efficiency(4096, 4096, 16, 128) == pytest.approx(full * 16 / 144
                                                                        * 4224 / 4096)


def test_flash_attention_runs_below_gemm_rate() -> None:
    k = Kernel("attention_fwd", 1e13, 1e6)
    t = compute.kernel_time(k, A100) - compute.LAUNCH_OVERHEAD
    assert t == pytest.approx(1e13 / (A100.matmul_flops * compute.FLASH_FWD_EFFICIENCY))


def test_mfu_definition() -> None:
    assert compute.mfu(312e12, 1.0, A100) == pytest.approx(1.0)
    assert compute.mfu(8 * 156e12, 1.0, A100, n_gpus=8) == pytest.approx(0.5)


def test_optimizer_is_memory_bound_over_adam_states() -> None:
    job = Job.from_config(load_workload("llama2-7b"))  # HF Trainer: adamw_torch_fused, clip 1.0
    total = sum(op.bytes for op in job.optimizer_ops())
    # fused AdamW reads fp32 p, g, m, v and writes p, m, v (28 B); clipping reads g twice and
    # writes it once (12 B)
    assert total == pytest.approx(40 * job.n_trainable)
    seconds = sum(compute.op_time(op, A100) for op in job.optimizer_ops())
    assert seconds > total / A100.memory_bandwidth


def test_gpt2_medium_on_rtx3090ti_matches_megatron_measurement() -> None:
    """mli/transformers-benchmarks (measurements.yaml 2x3090ti-gpt2-medium-megatron, 1 GPU):
    17.0 samples/s. Tolerance 15%."""
    job = Job.from_config(load_workload("gpt2-medium"))
    sps = compute.samples_per_second(job, gpu("rtx3090ti"))
    assert sps == pytest.approx(17.0, rel=0.15)


def test_mpt7b_compute_alone_beats_the_fsdp_run() -> None:
    """llm-foundry 8xA100 FSDP (measurements.yaml 8xa100-mpt-fsdp): 4641 tokens/s/GPU with
    communication; compute alone must be faster, and not absurdly so."""
    job = Job.from_config(load_workload("mpt-7b"))
    # forward and backward, and the optimizer over the 1/8 shard FSDP gives each GPU
    t = sum(compute.op_time(op, A100) for op in job.forward_ops() + job.backward_ops()) \
        + sum(compute.op_time(op, A100) for op in job.optimizer_ops()) / 8
    tokens = job.tokens_per_micro_batch / t
    assert 4641 < tokens < 1.3 * 4641
    assert 0.642 < compute.mfu(job.model_flops_per_step(), t, A100) < 0.85


def test_fp32_kernels_run_at_the_fp32_rate_not_the_tensor_core_rate() -> None:
    v100 = gpu("v100-sxm2")
    flops = 1e12  # big enough that compute, not memory, binds
    half = Op.of("conv", 0, "forward", [Kernel("dense", flops, 1e6, None, 2)])
    full = Op.of("conv", 0, "forward", [Kernel("dense", flops, 1e6, None, 4)])
    assert busy(half, v100) == pytest.approx(flops / compute.matmul_rate(v100))
    assert busy(full, v100) == pytest.approx(flops / compute.fp32_rate(v100))
    # V100: 95 TFLOPS of fp16 GEMM against 14.38 of fp32 (both measured): 6.6x slower
    assert busy(full, v100) / busy(half, v100) == pytest.approx(95 / 14.38)


def test_fp32_workload_builds_fp32_kernels() -> None:
    cfg = load_workload("gpt2-medium")
    fp32_cfg = cfg.copy(training=cfg.training.copy(precision="fp32"))
    for c, size in ((cfg, 2), (fp32_cfg, 4)):
        job = Job.from_config(c)
        kernels = [k for op in job.forward_ops() + job.backward_ops() for k in op.kernels
                   if k.kind == "gemm"]
        assert kernels and all(k.element_bytes == size for k in kernels)


def test_generic_layer_memory_traffic_is_bound_by_bandwidth() -> None:
    """A conv stage with BatchNorm/ReLU traffic takes longer on a GPU with less bandwidth; the
    same stage without it does not care."""
    from simulator.inputs.schema import GenericLayer, TrainingConfig, WorkloadConfig

    def stage(memory_bytes: float) -> Job:
        layer = GenericLayer(name="stage", params=1000, forward_flops_per_sample=1e9,
                             activation_bytes_per_sample=1e6,
                             memory_bytes_per_sample=memory_bytes)
        return Job.from_config(WorkloadConfig(name="x", layers=[layer], training=TrainingConfig(
            seq_len=1, micro_batch=32, precision="fp32", optimizer="sgd")))

    slow = replace(A100, memory_bandwidth=A100.memory_bandwidth / 4)
    with_traffic, without = stage(50e6), stage(0.0)
    assert compute.step_compute_time(with_traffic, slow) > \
        compute.step_compute_time(with_traffic, A100)
    assert compute.step_compute_time(with_traffic, A100) > compute.step_compute_time(without, A100)
    bwd = [k for op in with_traffic.backward_ops() for k in op.kernels if k.kind == "memory"]
    assert [k.bytes for k in bwd] == [2 * 50e6 * 32]


def test_flash_attention_efficiency_follows_the_architecture() -> None:
    a100, h100 = gpu("a100-sxm4-80gb"), gpu("h100-sxm")
    # FA2 reaches ~60% of peak on A100, ~35% on H100 (FA3 paper); on one H100 (flash-attention
    # PR 1791, head dim 128, seqlen 8192) FA3 ran 659 / 370 TFLOPS forward, 554 / 291 backward
    assert compute.flash_efficiency(h100) < compute.flash_efficiency(a100)
    assert compute.flash_efficiency(h100, 3) * 989 == pytest.approx(659, rel=0.01)
    assert compute.flash_efficiency(h100) * 989 == pytest.approx(370, rel=0.01)
    assert compute.flash_efficiency(h100, 3, backward=True) * 989 == pytest.approx(554, rel=0.01)
    assert compute.flash_efficiency(h100, backward=True) * 989 == pytest.approx(291, rel=0.01)
    # the same run under a causal mask: FA2 284 / 287, FA3 630 / 532 TFLOPS
    assert compute.flash_efficiency(h100, causal=True) * 989 == pytest.approx(284, rel=0.01)
    assert compute.flash_efficiency(h100, 3, causal=True) * 989 == pytest.approx(630, rel=0.01)
    assert compute.flash_efficiency(a100, causal=True) == compute.flash_efficiency(a100)
    assert compute.flash_efficiency(a100, 3) == compute.flash_efficiency(a100)  # no FA3 there
    fa2 = Kernel("attention_fwd", 1e13, 1e6, name="flash_attention_forward")
    fa3 = Kernel("attention_fwd", 1e13, 1e6, name="flash3_attention_forward")
    assert compute.kernel_time(fa3, h100) < compute.kernel_time(fa2, h100)


def test_triton_flash_attention_runs_at_fa2s_rate_over_the_fa2_papers_factor() -> None:
    # FA2 paper (arXiv:2307.08691, 4.1): FA2 is 1.3-2.5x faster than FlashAttention in Triton
    a100 = gpu("a100-sxm4-80gb")
    fa2 = Kernel("attention_fwd", 1e14, 0.0, name="flash_attention_forward_causal")
    triton = Kernel("attention_fwd", 1e14, 0.0, name="triton_flash_attention_forward_causal")
    ratio = compute.kernel_time(triton, a100) / compute.kernel_time(fa2, a100)
    assert 1.3 < ratio < 2.5
    assert ratio == pytest.approx(compute.TRITON_FLASH_SLOWDOWN, rel=1e-3)


def test_tensor_work_runs_at_the_clock_the_power_limit_holds() -> None:
    # GH100 at 700 W under full load: 1500 MHz (TileOPs#1587) and 1575 (DeepGEMM#120) of the
    # 1980 a short benchmark runs at; a card without a measured clock takes its datasheet's
    # rated tensor clock: H100 PCIe BF16 756 at 1.62 GHz (114 x 4096) of FP32 51 at 1.75 GHz
    h100, h200, a100 = gpu("h100-sxm"), gpu("h200"), gpu("a100-sxm4-80gb")
    assert h100.tensor_clock_share == pytest.approx((1500 + 1575) / 2 / 1980)
    assert h200.tensor_clock_share == h100.tensor_clock_share  # the same die at the same limit
    assert 1500 / 1980 < h100.tensor_clock_share < 1830 / 1980  # under the datasheet's rating
    assert gpu("h100-pcie").tensor_clock_share == pytest.approx(756 / (16 * 51), rel=1e-9)
    assert a100.tensor_clock_share == 1.0  # 312 = 16 x 19.5, and its rate a 3 s measurement
    big = Kernel("gemm", 2.0 * 8192**3, 0.0, (8192, 8192, 8192))
    assert compute.kernel_time(big, h100) == pytest.approx(
        2.0 * 8192**3 / (compute.gemm_rate(8192, 8192, 8192, h100) * h100.tensor_clock_share)
        + compute.LAUNCH_OVERHEAD)
    # FP32 CUDA-core work is rated at the maximum clock: no such share
    fp32 = Kernel("gemm", 2.0 * 8192**3, 0.0, (8192, 8192, 8192), element_bytes=4)
    assert compute.kernel_time(fp32, h100) == pytest.approx(
        2.0 * 8192**3 / compute.gemm_rate(8192, 8192, 8192, h100, 4) + compute.LAUNCH_OVERHEAD)


def test_a_layer_list_s_convolutions_run_in_tf32_where_the_card_has_it() -> None:
    """resnet50.yaml marks its conv stages `convolution`: under fp32 their dense work runs at
    the TF32 tensor rate on Ampere and later (half the 16-bit one), at the card's measured fp32
    GEMM rate before."""
    resnet = Job.from_config(load_workload("resnet50"))
    dense = [k for op in resnet.forward_ops() for k in op.kernels if k.kind == "dense"]
    assert [k.name for k in dense] == ["dense_tf32"] * 5 + ["dense"]  # fc is a Linear
    layer3 = replace(dense[3], bytes=0.0)  # its compute alone
    cuda = replace(layer3, name="dense")
    a100, rtx5090, v100 = gpu("a100-sxm4-80gb"), gpu("rtx5090"), gpu("v100-sxm2")
    for card in (a100, rtx5090):
        tf32 = compute.matmul_rate(card) * compute.sustained_share(card) * compute.TF32_PER_16BIT
        assert compute.kernel_work_time(cuda, card) / compute.kernel_work_time(layer3, card) \
            == pytest.approx(tf32 / compute.fp32_rate(card), rel=0.01)
    assert compute.kernel_work_time(layer3, v100) == compute.kernel_work_time(cuda, v100)


def test_fp32_gemms_run_at_the_measured_sgemm_rate() -> None:
    """torch.matmul in fp32 measured (catalog/gpus.py): two thirds of a GeForce card's spec
    FP32 (its second FP32 path idle), nearly all of an A100's; a card without a measurement
    gets the share measured cards of its generation reach."""
    for name, measured in (("rtx4090", 54.77e12), ("a100-sxm4-80gb", 19.18e12),
                           ("v100-sxm2", 14.38e12)):
        assert compute.fp32_rate(gpu(name)) == pytest.approx(measured)
    rtx4090 = gpu("rtx4090")
    assert compute.fp32_rate(rtx4090) < 0.7 * rtx4090.fp32_flops  # type: ignore[operator]
    a40, a6000, rtx3090 = gpu("a40"), gpu("rtx-a6000"), gpu("rtx3090")  # all GA102, sm86
    assert a40.fp32_matmul_flops is None
    shares = sorted(c.fp32_matmul_flops / c.fp32_flops  # type: ignore[operator]
                    for c in (a6000, rtx3090))
    assert compute.fp32_rate(a40) == pytest.approx(a40.fp32_flops * sum(shares) / 2)  # type: ignore[operator]
