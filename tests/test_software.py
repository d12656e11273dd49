"""The software stack (simulator/catalog/software.py): years and versions, the GEMM rows by
library generation, the attention kernels a stack runs, what framework bundles select."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.api import RunSpec, simulate
from simulator.catalog import software
from simulator.catalog.gpus import GPUS
from simulator.cli import main
from simulator.errors import InputError
from simulator.job import compute, recipe
from simulator.machine.build import load_machine

T = 1e12


def test_a_year_names_the_stack_its_published_runs_used() -> None:
    stack = software.resolve(2023)
    assert (stack.torch, stack.cuda) == ((2, 0, 0), (11, 8, 0))
    assert software.resolve(None) is software.TODAY
    later = software.resolve(2031)  # after the tables: today's rates
    assert (later.torch, later.cuda) == (software.TODAY.torch, software.TODAY.cuda)
    with pytest.raises(InputError, match="start at 2018"):
        software.resolve(2015)


def test_versions_take_the_default_wheels_cuda_unless_given() -> None:
    assert software.resolve({"torch": "2.1"}).cuda == (12, 1, 0)  # PyPI 2.1 wheel: cu121
    assert software.resolve({"torch": "2.1.1+cu118", "cuda": "11.8"}).torch == (2, 1, 1)
    assert software.parse_flag("torch=2.1,cuda=12.1") == {"torch": "2.1", "cuda": "12.1"}
    assert software.parse_flag("2023") == 2023
    for bad in ("torch=two", "cuda=12.1", "pytorch=2.1"):
        with pytest.raises(InputError):
            software.parse_flag(bad)


def test_hopper_gemm_rows_follow_the_published_cublas_measurements() -> None:
    h100 = GPUS["h100-sxm"]
    machine = load_machine("8xh100-nvswitch")
    rates = {}
    for cuda in ("11.8", "12.0", "12.1", "12.8"):
        stack = software.resolve({"torch": "2.1", "cuda": cuda})
        card = machine.for_job("x", stack, precision="bf16").gpu
        rates[cuda] = compute.matmul_rate(card) / T
    # pytorch/pytorch#100850: cuBLAS 11.11 median 720, cuBLAS 12.0 median 549.5 TFLOPS
    assert rates["11.8"] == pytest.approx(720.0, rel=1e-6)
    assert rates["12.0"] == pytest.approx(549.5, rel=1e-6)
    assert rates["12.1"] == rates["12.8"] == pytest.approx(h100.plain_matmul_flops / T)


def test_other_architectures_have_one_row_and_a_topologys_own_rate_is_kept(tmp_path: Path) -> None:
    old = software.resolve(2023)
    a100 = load_machine("8xa100-nvswitch").for_job("x", old, precision="bf16").gpu
    assert compute.matmul_rate(a100) == compute.matmul_rate(GPUS["a100-sxm4-80gb"])
    path = tmp_path / "own.yaml"
    path.write_text("name: own\ngpu: {base: h100-sxm, matmul_tflops: 700}\nnodes:\n"
                    "  - {id: cpu0, kind: cpu}\n  - {id: gpu0, kind: gpu}\n"
                    "links:\n  - {a: cpu0, b: gpu0, kind: pcie, gen: 5, lanes: 16}\n")
    card = load_machine(str(path)).for_job("x", old, precision="bf16").gpu
    assert compute.matmul_rate(card) == pytest.approx(700 * T)  # measured there: kept


def test_a_stack_without_kernels_for_the_card_is_refused() -> None:
    with pytest.raises(InputError, match="needs CUDA 12.8"):
        load_machine("2x5090").for_job("x", software.resolve(2023), precision="bf16")


def test_attention_kernels_by_stack() -> None:
    old, new = software.resolve({"torch": "2.1"}), software.TODAY
    assert software.attention_kernel("sdpa", old) == "flash1"  # FA2 in SDPA from 2.2
    assert software.attention_kernel("sdpa", new) == "flash2"
    assert software.attention_kernel("flash", old) == "flash2"
    with pytest.raises(InputError, match="CUDA 12.3"):
        software.attention_kernel("flash3", old)
    with pytest.raises(InputError, match="PyTorch 2.0"):
        software.attention_kernel("sdpa", software.resolve(2022))


def test_bundles_select_the_attention_their_configs_ran() -> None:
    assert recipe.bundle("hf", software.resolve(2023))["attention"] == "eager"  # torch < 2.1.1
    assert recipe.bundle("hf")["attention"] == "sdpa"
    assert recipe.bundle("llm-foundry", software.resolve(2023))["attention"] == "triton"
    assert recipe.bundle("llm-foundry")["attention"] == "flash2"


@pytest.mark.parametrize(("family", "first"), [("llama", "4.36"), ("bert", "4.41"),
                                                ("gpt2", "4.42")])
def test_transformers_runs_sdpa_from_the_release_whose_model_class_took_it(
        family: str, first: str) -> None:
    """Before its class's ``_supports_sdpa`` a model ran eager attention under transformers'
    defaults, whatever the torch (modeling_<model>.py of each release)."""
    def attention(hf: str) -> str:
        stack = software.resolve({"torch": "2.3", "transformers": hf})
        return recipe.bundle_attention("hf", stack, family)

    major, minor = first.split(".")
    assert attention(f"{major}.{int(minor) - 1}") == "eager"
    assert attention(first) == "sdpa"
    assert recipe.bundle_attention("torchtune", software.resolve(
        {"torch": "2.3", "transformers": "4.30"}), family) == "sdpa"  # not transformers' class


def test_flash1_runs_at_half_flash2s_rate() -> None:
    from simulator.job.attention import flash

    gpu = GPUS["a100-sxm4-80gb"]
    k1 = flash(4, 2048, 2048, 2048, 2, causal=True, backward=False, version=1)
    k2 = flash(4, 2048, 2048, 2048, 2, causal=True, backward=False, version=2)
    flop1 = k1.flops / (compute.kernel_time(k1, gpu) - compute.LAUNCH_OVERHEAD)
    flop2 = k2.flops / (compute.kernel_time(k2, gpu) - compute.LAUNCH_OVERHEAD)
    assert flop2 / flop1 == pytest.approx(software.FLASH1_SLOWDOWN)


def test_a_padding_mask_sends_sdpa_to_its_memory_efficient_kernel() -> None:
    stack = software.resolve({"torch": "2.2"})
    assert software.attention_kernel("sdpa", stack, padded=True) == "mem_efficient"
    for impl, kernel in (("flash2", "flash2"), ("eager", "eager"), ("sdpa", "flash2")):
        assert software.attention_kernel(impl, stack, padded=impl != "sdpa") == kernel


def test_transformers_4_38_and_4_39_mask_every_llama_call_so_sdpa_leaves_its_flash_kernel(
        capsys: pytest.CaptureFixture[str]) -> None:
    """transformers PR 30070: Llama's sdpa got a mask tensor on every call in 4.38-4.39."""
    kernels = {}
    for hf in ("4.37", "4.38", "4.39", "4.40"):
        args = ["run", "-t", "8xa100-nvswitch", "-w", "llama3.2-1b", "--gpus", "1",
                "--no-ranges", "--seq-len", "4096", "--attention", "sdpa", "--json",
                "--software", f"torch=2.2,transformers={hf}"]
        assert main(args) == 0
        report = json.loads(capsys.readouterr().out)
        kernels[hf] = (report["software"]["attention"]["kernel"], report["step_time_s"])
        assert report["software"]["stack"]["transformers"] == hf  # the flag's version is used
    assert [kernels[v][0] for v in ("4.37", "4.38", "4.39", "4.40")] == \
        ["flash2", "mem_efficient", "mem_efficient", "flash2"]
    assert kernels["4.38"][1] > kernels["4.37"][1] == kernels["4.40"][1]
    assert main(args[:-2] + ["--software", "torch=2.2,transformers=4.38,transformers=4.39"]) == 2
    assert "transformers is given twice" in capsys.readouterr().out
    masked = args[:-2] + ["--software", "torch=2.2,transformers=4.38"]
    assert main([a for a in masked if a != "--json"]) == 0
    assert "transformers 4.38 gives Llama's sdpa a mask on every call" in capsys.readouterr().out
    # a framework with its own modules keeps the flash kernel; transformers 4.38's GPT-2
    # class has no sdpa at all (4.42 on), which transformers refuses as stepsim does
    assert main(masked + ["--framework", "torchtune"]) == 0
    assert json.loads(capsys.readouterr().out)["software"]["attention"]["kernel"] == "flash2"
    gpt2 = [a.replace("llama3.2-1b", "gpt2-medium") for a in masked] + ["--framework", "hf"]
    assert main(gpt2) == 2
    assert "transformers 4.38's gpt2 class has no sdpa (it takes it from 4.42" in \
        capsys.readouterr().out
    assert main([a.replace("4.38", "4.42") for a in gpt2]) == 0
    assert json.loads(capsys.readouterr().out)["software"]["attention"]["kernel"] == "flash2"


def test_the_memory_efficient_kernel_computes_every_pair_at_flash1s_rate() -> None:
    from simulator.job.attention import flash

    gpu = GPUS["a100-sxm4-80gb"]
    b, s, h, e = 4, 2048, 4096, 2
    for backward in (False, True):
        masked = flash(b, s, h, h, e, causal=True, backward=backward, version="mem_efficient")
        full = flash(b, s, h, h, e, causal=False, backward=backward, version=2)
        assert masked.flops == full.flops  # the mask is a tensor: no tile skipped
        assert masked.bytes == full.bytes + b * s * s * e  # and it is read
        busy = compute.kernel_time(masked, gpu) - compute.LAUNCH_OVERHEAD
        assert busy == pytest.approx(software.FLASH1_SLOWDOWN * (
            compute.kernel_time(full, gpu) - compute.LAUNCH_OVERHEAD))


def test_below_sm80_sdpa_runs_its_memory_efficient_kernel() -> None:
    today, old = software.resolve(None), software.resolve({"torch": "2.1"})
    v100, turing, a100 = (GPUS[g].compute_capability for g in
                          ("v100-sxm2", "rtx2080ti", "a100-sxm4-80gb"))
    for stack, cc, kernel in ((today, v100, "mem_efficient"), (old, v100, "mem_efficient"),
                              (today, turing, "mem_efficient"), (old, turing, "flash1"),
                              (today, a100, "flash2"), (old, a100, "flash1")):
        assert software.kernel_on_gpu(software.attention_kernel("sdpa", stack), "sdpa",
                                      cc) == kernel
    assert software.kernel_on_gpu("flash2", "flash2", a100) == "flash2"


def test_below_sm80_the_tables_row_is_the_flash_class_kernels_own() -> None:
    from simulator.job.attention import flash

    def busy(version: int | str, gpu: str) -> float:
        k = flash(4, 2048, 2048, 2048, 2, causal=True, backward=False, version=version)
        return (compute.kernel_time(k, GPUS[gpu]) - compute.LAUNCH_OVERHEAD) / k.flops

    # the mask costs its bytes and every pair its FLOPs (above), but no second slowdown
    assert busy("mem_efficient", "rtx2080ti") == pytest.approx(busy(2, "rtx2080ti"))
    assert busy(1, "rtx2080ti") == pytest.approx(busy(2, "rtx2080ti"))
    assert busy("mem_efficient", "a100-sxm4-80gb") == pytest.approx(
        software.FLASH1_SLOWDOWN * busy(2, "a100-sxm4-80gb"))


def test_flash_attn_on_a_gpu_it_does_not_run_on_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "-t", "2x2080ti-switch", "--seq-len", "512", "--micro-batch", "1"]
    assert main([*base, "-w", "gpt2-medium", "--attention", "flash2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "stepsim run: error: --attention flash2: attention flash2 (the flash-attn package) "
        "needs sm80 or newer (flash-attention README); the rtx2080ti is sm75: attention sdpa "
        "runs there (its memory-efficient kernel)")
    workload = "validation/workloads/llamafactory-qwen2.5-0.5b.yaml"  # attention: flash2
    assert main([*base, "-w", workload]) == 2
    assert capsys.readouterr().err.startswith(
        f"stepsim run: error: {workload}:17: training.attention: attention flash2 ")
    assert main([*base, "-w", "gpt2-medium", "--attention", "flash1", "--no-ranges"]) == 0
    assert "attention kernel flash1" in capsys.readouterr().out  # flash-attn 1.x: sm75


def test_fp32_inputs_send_sdpa_to_its_memory_efficient_kernel_and_refuse_flash_attn() -> None:
    stack = software.resolve(None)
    assert software.attention_kernel("sdpa", stack, fp32=True) == "mem_efficient"
    assert software.attention_kernel("eager", stack, fp32=True) == "eager"
    for impl in software.HALF_ONLY:
        with pytest.raises(InputError, match="takes fp16 and bf16 only"):
            software.attention_kernel(impl, stack, fp32=True)


def test_fp32_attention_runs_at_its_measured_slowdown_from_ampere_on_cuda_cores_before() -> None:
    from simulator.job.attention import flash

    def busy(e: int, gpu: str) -> float:  # seconds per FLOP, compute-bound
        k = flash(8, 4096, 4096, 4096, e, causal=True, backward=False, version="mem_efficient")
        return (compute.kernel_work_time(k, GPUS[gpu]) - compute.LAUNCH_OVERHEAD) / k.flops

    # the fp32 kernel 3.5-4.3x slower than the fp16 one on an A100 (xformers PRs 467, 587)
    assert 3.4 < busy(4, "a100-sxm4-80gb") / busy(2, "a100-sxm4-80gb") < 4.3
    turing = GPUS["rtx2080ti"]  # the CUDA cores: its fp32 GEMM rate over its 16-bit one
    assert busy(4, "rtx2080ti") / busy(2, "rtx2080ti") == pytest.approx(
        compute.matmul_rate(turing) / compute.fp32_rate(turing))


def test_an_fp32_run_reports_the_memory_efficient_kernel_and_a_flash_flag_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "-t", "8xa100-nvswitch", "--gpus", "1", "-w", "llama3.2-1b", "--no-ranges",
            "--precision", "fp32", "--micro-batch", "1", "--seq-len", "1024"]
    assert main([*base, "--attention", "sdpa", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["software"]["attention"]["kernel"] == "mem_efficient"
    assert main([*base, "--attention", "flash2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "stepsim run: error: --attention flash2: attention flash2 takes fp16 and bf16 only "
        "(flash-attn flash_api.cpp: \"FlashAttention only support fp16 and bf16 data type\"); "
        "an fp32 run takes attention sdpa (its memory-efficient kernel takes fp32) or eager")


def test_an_error_about_a_flagged_training_key_names_the_flag_not_the_workload_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "1x4090", "-w", "gpt2-medium", "--attention", "sdpa",
                 "--software", "2022"]) == 2
    assert capsys.readouterr().err.strip() == (
        "stepsim run: error: --attention sdpa: attention sdpa needs PyTorch 2.0 or later "
        "(scaled_dot_product_attention); the stack has 1.13")


def test_a_model_without_attention_names_no_attention(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "8xa100-nvswitch", "--gpus", "1", "-w", "resnet50", "--no-ranges",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["software"]["attention"] is None and report["recipe"]["attention"] is None
    assert main(["run", "-t", "8xa100-nvswitch", "--gpus", "1", "-w", "resnet50",
                 "--no-ranges"]) == 0
    text = capsys.readouterr().out
    assert "attention" not in text and "fp32 cross-entropy, fp32, sgd" in text


def test_a_t4_runs_at_its_power_capped_rate_and_emulates_bf16_at_its_own_measured_share(
        capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.catalog.gpus import from_device_name, half_dtype_share

    t4 = GPUS["t4"]
    assert from_device_name("Tesla T4") == ("t4", None)
    assert compute.matmul_rate(t4) == pytest.approx(24e12)  # sustained under 70 W
    # its own measured bf16 share (5-6% of fp16), where a Turing card without one would take
    # the median of the architecture's measured cards
    assert half_dtype_share(t4, "bf16") == pytest.approx(0.056, abs=0.003)
    assert half_dtype_share(t4, "bf16") < half_dtype_share(GPUS["rtx2080ti"], "bf16")
    args = ["run", "-t", "1xt4-colab", "-w", "gpt2-medium", "--micro-batch", "2", "--json",
            "--no-ranges"]
    assert main([*args, "--precision", "fp16"]) == 0
    fp16 = json.loads(capsys.readouterr().out)
    assert main([*args, "--precision", "bf16"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert fp16["memory"]["capacity_bytes"] == 15 * 2**30
    assert bf16["step_time_s"] > 5 * fp16["step_time_s"]


def test_padded_batches_slow_an_sdpa_step_and_the_report_says_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "-t", "8xa100-nvswitch", "-w", "llama3.2-1b", "--gpus", "1", "--no-ranges",
            "--seq-len", "4096", "--attention", "sdpa", "--json"]
    assert main(args) == 0
    packed = json.loads(capsys.readouterr().out)
    assert main(args + ["--padded"]) == 0
    padded = json.loads(capsys.readouterr().out)
    assert padded["software"]["attention"]["kernel"] == "mem_efficient"
    assert "padding mask" in padded["software"]["attention"]["source"]
    assert padded["step_time_s"] > packed["step_time_s"]


def test_an_old_stack_slows_the_h100_step_and_the_report_names_its_rows() -> None:
    today = simulate(RunSpec("8xh100-nvswitch", "mpt-7b", "fsdp", micro_batch=1),
                     baseline=False).report
    old = simulate(RunSpec("8xh100-nvswitch", "mpt-7b", "fsdp", micro_batch=1, software="2023"),
                   baseline=False).report
    assert old["step_time_s"] > today["step_time_s"]
    assert old["software"]["gemm"]["row"].startswith("CUDA 11.8")
    assert old["software"]["attention"]["kernel"] == "triton"  # llm-foundry on torch 2.0
    assert today["software"]["attention"]["kernel"] == "flash2"
    assert today["software"]["stack"]["given"] == "today"


def test_the_flag_and_a_bad_stack(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "-t", "8xa100-nvswitch", "-w", "llama3.2-1b", "--gpus", "1", "--no-ranges"]
    assert main(args + ["--software", "torch=2.1.1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["software"]["attention"]["kernel"] == "flash1"  # hf sdpa on torch 2.1.1
    assert main(args + ["--software", "torch=two"]) == 2
    assert "torch version 'two'" in capsys.readouterr().err


@pytest.mark.parametrize("value, words", [("1999", "the tables start at 2018"),
                                          ("torch=1.2", "give cuda too"),
                                          ("cuda=12.1", "give torch")])
def test_a_bad_software_flag_is_named_as_the_flag(value: str, words: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The value came from --software, not from the workload file it overrides."""
    args = ["run", "-t", "8xa100-nvswitch", "-w", "llama3.2-1b", "--gpus", "1", "--no-ranges"]
    assert main(args + ["--software", value]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"stepsim run: error: --software '{value}': ") and words in line
    assert "yaml" not in line


def test_bf16_without_bf16_tensor_cores_is_emulated_on_the_cuda_cores(
        capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.catalog.gpus import half_dtype_share

    turing, a100 = GPUS["rtx2080ti"], GPUS["a100-sxm4-80gb"]
    # measured: an RTX 2080 Ti's bf16 GEMM at 14% of its fp16 one, under its fp32 GEMM's 23%
    assert half_dtype_share(turing, "bf16") == pytest.approx(6.95 / 49.61)
    assert half_dtype_share(turing, "bf16") < turing.fp32_flops / turing.matmul_flops  # type: ignore[operator]
    assert half_dtype_share(turing, "fp16") == half_dtype_share(a100, "bf16") == 1.0
    bf16 = load_machine("2x2080ti-switch").for_job("x", software.resolve(None),
                                                   precision="pure-bf16").gpu
    gemm = (4096, 4096, 4096)
    assert compute.gemm_rate(*gemm, bf16, 2) == pytest.approx(
        compute.gemm_rate(*gemm, turing, 2) * half_dtype_share(turing, "bf16"))
    assert compute.fp32_rate(bf16) == pytest.approx(compute.fp32_rate(turing))
    args = ["run", "-t", "2x2080ti-switch", "-w", "gpt2-medium", "--seq-len", "512",
            "--micro-batch", "2", "--no-ranges", "--json"]
    assert main([*args, "--precision", "bf16"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert main([*args, "--precision", "fp16"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert slow["step_time_s"] > fast["step_time_s"]
    assert slow["software"]["gemm"]["bf16_on_cuda_cores"] == pytest.approx(
        half_dtype_share(turing, "bf16"))
    assert "bf16_on_cuda_cores" not in fast["software"]["gemm"]
