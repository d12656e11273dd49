"""stepsim advise: candidates pruned by memory, ranked as their runs are, explained."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from typing import Any

import pytest

from simulator import api
from simulator.advice import advise, bound, candidates, explain, spec_text
from simulator.cli import main
from simulator.machine.scales import NEUTRAL
from simulator.outputs.cost import Prices

KEYS = {"candidates", "best", "nothing_fits", "what_would_fit", "explanation", "confidence",
        "without_thin_mechanisms"}
SIMULATED: list[api.RunSpec] = []  # what the fixture's search simulated, ranged runs apart


@pytest.fixture(scope="module")
def answer() -> dict:
    machine = advise.PricedMachine("2x5090", Prices(usd_per_gpu_hour=1.0))
    simulate = api.simulate

    def counted(spec: api.RunSpec, **options: Any) -> api.RunResult:
        if not options.get("ranges") and spec.scales == NEUTRAL:  # a range's re-runs apart
            SIMULATED.append(spec)
        return simulate(spec, **options)

    with pytest.MonkeyPatch.context() as mp:  # one process: every simulation passes here
        mp.setattr(advise.api, "simulate", counted)
        return advise.advise([machine], "gpt2-medium", jobs=1)


def test_the_answer_has_exactly_the_contract_keys(answer: dict) -> None:
    assert set(answer) == KEYS
    assert answer["nothing_fits"] is False and answer["what_would_fit"] == []


def test_nothing_that_does_not_fit_is_ranked(answer: dict) -> None:
    assert len(answer["candidates"]) > 20
    assert all(candidates.fits(r["memory"]) for r in answer["candidates"])
    unfit = re.search(r"; (\d+) simulated did not fit", answer["explanation"][1])
    assert len(answer["candidates"]) == len(SIMULATED) - (int(unfit[1]) if unfit else 0)


def test_the_simulated_count_is_the_distinct_configurations_simulated(answer: dict) -> None:
    said = re.search(r"; (\d+) configurations simulated in", answer["explanation"][0])
    assert said is not None and int(said[1]) == len(SIMULATED) == len(set(SIMULATED))
    assert len(SIMULATED) > len(candidates.enumerate_machine(
        api.RunSpec("2x5090", "gpt2-medium")).first)  # variants were simulated too


def test_no_simulated_run_beats_its_compute_bound(answer: dict) -> None:
    for r in answer["candidates"]:  # the bound is what pruning trusts: it must hold
        spec = spec_text.spec_of(r["options"])
        assert r["tokens_per_s"] <= bound.tokens_per_s_bound(spec) * (1 + 1e-9), r["label"]


def test_the_search_varies_micro_batch_accumulation_and_buckets(answer: dict) -> None:
    ranked = [r["options"] for r in answer["candidates"]]
    assert any(o["grad_accum"] and o["grad_accum"] > 1 and o["pp"] == 1 for o in ranked)
    assert any(o["bucket_cap_mb"] is not None for o in ranked)
    assert any(o["pp"] > 1 for o in ranked)


def test_candidates_are_ranked_by_the_objective(answer: dict) -> None:
    speeds = [r["tokens_per_s"] for r in answer["candidates"]]
    assert speeds == sorted(speeds, reverse=True)
    assert answer["best"]["options"] == answer["candidates"][0]["options"]


def test_the_winner_is_what_stepsim_run_gives_with_its_options(
        answer: dict, capsys: pytest.CaptureFixture[str]) -> None:
    best = answer["best"]
    argv = shlex.split(best["command"])[1:] + ["--json"]
    assert main(argv) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert run["tokens_per_s"] == pytest.approx(answer["candidates"][0]["tokens_per_s"])
    assert best["step_time_s_range"][0] <= best["step_time_s"] <= best["step_time_s_range"][1]


def test_the_explanation_names_the_winner_its_bottleneck_and_the_runner_up(answer: dict
                                                                          ) -> None:
    text = "\n".join(answer["explanation"])
    assert text.count("best (throughput):") == 1 and "why: " in text
    assert "runner-up:" in text and "per million tokens" in text
    assert "range: " in text


def test_a_job_that_needs_sharding_says_why_plain_ddp_does_not_fit() -> None:
    # memory only (no simulation): a full 7B fine-tune on eight 32 GB cards
    choices = candidates.enumerate_machine(api.RunSpec("8x5090-dual-socket", "llama2-7b"))
    assert choices.first and {s.strategy for s in choices.first} >= {"fsdp", "zero3"}
    assert "ddp" not in {s.strategy for s in choices.first if s.pp == 1}  # plain DDP
    assert any(s.pp > 1 for s in choices.first)  # a pipeline of DDP stages can fit
    lines = explain.not_fitting_lines(choices.verdicts)
    ddp = next(line for line in lines if line.startswith("ddp does not fit"))
    assert "checkpointing full at micro-batch 1" in ddp and "every GPU" in ddp


def test_when_nothing_fits_it_says_what_would(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "-t", "2x5090", "-w", "llama2-70b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"schema_version", *KEYS} and out["nothing_fits"] is True
    assert out["candidates"] == [] and out["best"] is None
    changes = " ".join(w["change"] for w in out["what_would_fit"])
    assert "QLoRA" in changes and "x rtx5090" in changes and "GiB of RAM" in changes
    assert all(w["fits"] and w["peak_bytes"] > 0 for w in out["what_would_fit"])
    more = next(w for w in out["what_would_fit"] if "such machines" in w["change"])
    boxes = more["gpus"] // 2
    assert f"--nnodes {boxes} simulates them joined by the topology's network" in more["detail"]
    assert any("nothing fits" in line for line in out["explanation"])


def test_micro_batches_go_up_to_the_largest_that_fits() -> None:
    assert candidates.micro_batches(6) == [1, 2, 3, 4, 5, 6]  # every size of short rows
    assert candidates.micro_batches(20, seq_len=4096) == [1, 2, 4, 8, 16, 20]
    assert candidates.micro_batches(8, above=2, seq_len=4096) == [4, 8]


@pytest.mark.parametrize(("topology", "workload", "recipe", "mode"), [
    ("2x5090", "gpt2-medium", candidates.Recipe("fsdp"), "none"),
    ("2x5090", "llama2-7b", candidates.Recipe("zero3", offload="params"), "full"),
    ("8x5090-dual-socket", "llama2-7b", candidates.Recipe("fsdp", kernels="compiled"), "full"),
    ("2x5090", "gpt2-medium", candidates.Recipe("ddp", pp=2, grad_accum=8), "selective"),
])
def test_the_largest_micro_batch_is_the_boundary(topology: str, workload: str,
                                                 recipe: candidates.Recipe, mode: str) -> None:
    base = api.RunSpec(topology, workload)
    verdict = candidates.largest_micro_batch(base, recipe, mode)
    assert verdict is not None and verdict.largest > 1
    at, over = (candidates.memory_verdict(candidates._spec(base, recipe, mode, b))
                for b in (verdict.largest, verdict.largest + 1))
    assert at is not None and candidates.fits(at)
    assert over is None or not candidates.fits(over)


@pytest.mark.parametrize(("flags", "message"), [
    (["--objective", "cost"], "--price-per-gpu-hour"),
    (["--objective", "time-to-train"], "--train-tokens"),
    (["--objective", "speed"], "--objective"),
])
def test_an_objective_without_what_it_needs_is_one_line(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "-t", "2x3090ti-nvlink", "-w", "gpt2-medium", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_several_machines_ranked_per_dollar_in_parallel(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert main(["advise", "-t", "2x5090", "-t", "2x3090ti-nvlink", "-w", "gpt2-medium",
                 "--objective", "cost", "--price-per-gpu-hour", "0.9",
                 "--price-per-gpu-hour", "0.3", "--jobs", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    costs = [r["cost"]["usd_per_million_tokens"] for r in out["candidates"]]
    assert costs == sorted(costs)
    assert {r["options"]["topology"] for r in out["candidates"]} == {"2x5090", "2x3090ti-nvlink"}
    text = "\n".join(out["explanation"])
    assert "machines, best first:" in text and "wins on cost" in text


def test_pipelines_are_candidates_with_enough_micro_batches() -> None:
    recipes = candidates.recipes(8)
    pipes = [r for r in recipes if r.pp > 1]
    assert {r.pp for r in pipes} == {2, 4, 8}
    assert all(r.grad_accum is not None and r.grad_accum >= 2 * r.pp for r in pipes)
    spec = next(s for s in candidates.enumerate_machine(
        api.RunSpec("8x5090-dual-socket", "llama2-7b")).first if s.pp > 1)
    assert "--pp" in spec_text.run_command(spec) and "pipeline" in spec_text.label(spec)


def test_offload_is_tried_where_the_gpus_cannot_hold_the_states_alone() -> None:
    choices = candidates.enumerate_machine(api.RunSpec("2x5090", "llama2-7b"))
    offloaded = [s for s in choices.first if s.offload != "none"]
    assert offloaded and all(s.strategy in ("zero1", "zero2", "zero3", "fsdp")
                             for s in offloaded)
    assert "--offload" in spec_text.run_command(offloaded[0])


def test_variants_keep_the_batch_and_try_the_frameworks_switches() -> None:
    spec = api.RunSpec("8x5090-dual-socket", "llama2-7b", "ddp", pp=2, grad_accum=8,
                       micro_batch=4, checkpointing="full")
    lighter = [replace(spec, micro_batch=1, checkpointing="none")]
    out = list(candidates.variants(spec, 0, 1, lighter))
    batches = {(v.micro_batch, v.checkpointing): v.grad_accum for v in out
               if v.bucket_mb is None}
    # 32 sequences a step: micro-batch 2 in 16 micro-batches; 1 (either mode) would need 32
    assert batches == {(2, "full"): 16}
    assert all(v.grad_accum <= candidates.MAX_PIPELINE_MICRO_BATCHES for v in out)
    assert {v.bucket_mb for v in out} == {None, *candidates.DDP_BUCKETS_MB}  # 4 DDP replicas
    zero = api.RunSpec("2x5090", "llama2-7b", "zero2", micro_batch=2, offload="optimizer",
                       checkpointing="full")
    switched = list(candidates.variants(zero, 0, 1))
    assert any(v.zero_overlap_comm for v in switched) and any(v.pin_memory for v in switched)
    assert [(v.micro_batch, v.grad_accum) for v in switched if v.micro_batch == 1] == [(1, 2)]


def test_torch_compile_is_tried_where_the_framework_has_the_switch() -> None:
    assert candidates.kernel_regimes(api.RunSpec("2x5090", "llama2-7b")) == (None, "compiled")
    assert candidates.kernel_regimes(api.RunSpec("2x5090", "llama2-7b",
                                                 kernels="eager")) == (None,)
    assert candidates.kernel_regimes(api.RunSpec("2x5090", "llama2-7b",
                                                 framework="megatron")) == (None,)
    choices = candidates.enumerate_machine(api.RunSpec("8x5090-dual-socket", "llama2-7b"))
    assert any(s.kernels == "compiled" for s in choices.first)
    for compiled, eager in choices.eager.items():  # eager only where compiled fits less
        assert eager.kernels is None and compiled.kernels == "compiled"
        assert (eager.micro_batch or 0) <= (compiled.micro_batch or 0)
    assert {r.schedule for r in candidates.recipes(8) if r.pp > 1} == {"1f1b", "interleaved"}


def _small_llama(tmp_path: Any, name: str, training: str) -> Any:
    """A four-layer Llama workload YAML named ``name`` with the ``training`` keys given."""
    workload = tmp_path / f"{name}.yaml"
    workload.write_text(f"name: {name}\nmodel: {{family: llama, layers: 4, hidden: 1024, "
                        "heads: 16, kv_heads: 4, ffn_hidden: 4096, vocab: 32000}\n"
                        f"training: {{{training}}}\n")
    return workload


def test_padded_batches_name_flash_attention_beside_the_pick(tmp_path: Any) -> None:
    workload = _small_llama(tmp_path, "padded", "seq_len: 4096, micro_batch: 1, padded: true")
    machines = [advise.PricedMachine("1x4090", Prices(usd_per_gpu_hour=1.0))]
    answer = advise.advise(machines, str(workload), jobs=1)
    best = answer["best"]
    assert best["software"]["attention"]["kernel"] == "mem_efficient"
    line = next(x for x in answer["explanation"] if x.startswith("padded batches"))
    flash = api.simulate(replace(spec_text.spec_of(best["options"]), attention="flash2"),
                         baseline=False, ranges=False).report
    assert f"{flash['tokens_per_s']:,.0f} tokens/s" in line
    assert flash["tokens_per_s"] > best["tokens_per_s"]  # every pair, at FA1's rate: slower
    unpadded = tmp_path / "packed.yaml"
    unpadded.write_text(workload.read_text().replace("padded: true", "padded: false"))
    plain = advise.advise(machines, str(unpadded), jobs=1)
    assert not any(x.startswith("padded batches") for x in plain["explanation"])
    # transformers 4.38 masks every Llama call: the same line, with its cause
    masked = tmp_path / "masked.yaml"
    masked.write_text(unpadded.read_text().replace(
        "padded: false", 'padded: false, software: {torch: "2.2", transformers: "4.38"}'))
    hf = advise.advise(machines, str(masked), jobs=1)
    line = next(x for x in hf["explanation"] if x.startswith("transformers 4.38 gives"))
    assert "takes no mask" in line


def test_below_sm80_sdpa_is_memory_efficient_whatever_the_batches(tmp_path: Any) -> None:
    """On an RTX 2080 Ti sdpa runs its memory-efficient kernel padded or not, and flash-attn 2
    does not run: advise picks as usual and offers no flash-attn line."""
    workload = _small_llama(tmp_path, "padded", "seq_len: 2048, micro_batch: 1, padded: true")
    machines = [advise.PricedMachine("2x2080ti-switch", Prices(usd_per_gpu_hour=1.0))]
    for path in (workload, tmp_path / "packed.yaml"):
        path.write_text(workload.read_text().replace(
            "padded: true", "padded: " + str(path.name == "padded.yaml").lower()))
        answer = advise.advise(machines, str(path), jobs=1)
        assert answer["best"]["software"]["attention"]["kernel"] == "mem_efficient"
        assert not any(x.startswith("padded batches") for x in answer["explanation"])


def test_advise_padded_flag_reaches_every_candidate_and_its_command(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    workload = _small_llama(tmp_path, "small", "seq_len: 4096, micro_batch: 1")
    assert main(["advise", "-t", "1x4090", "-w", str(workload), "--padded", "--json",
                 "--jobs", "1"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert all(r["options"]["padded"] for r in answer["candidates"])
    assert all(r["software"]["attention"]["kernel"] == "mem_efficient"
               for r in answer["candidates"])
    best = answer["best"]
    assert "--padded" in shlex.split(best["command"])
    assert spec_text.spec_of(best["options"]).padded
    assert any(x.startswith("padded batches") for x in answer["explanation"])


def test_a_bf16_pick_without_bf16_tensor_cores_names_fp16_beside_it(tmp_path: Any) -> None:
    workload = _small_llama(tmp_path, "small", "seq_len: 1024, micro_batch: 1, precision: bf16")
    turing = [advise.PricedMachine("2x2080ti-switch", Prices(usd_per_gpu_hour=1.0))]
    answer = advise.advise(turing, str(workload), jobs=1)
    best = answer["best"]
    line = next(x for x in answer["explanation"] if x.startswith("bf16 on the rtx2080ti"))
    fp16 = api.simulate(replace(spec_text.spec_of(best["options"]), precision="fp16"),
                        baseline=False, ranges=False).report
    assert f"{fp16['tokens_per_s']:,.0f} tokens/s" in line
    assert fp16["tokens_per_s"] > best["tokens_per_s"]
    ampere = [advise.PricedMachine("1x4090", Prices(usd_per_gpu_hour=1.0))]
    plain = advise.advise(ampere, str(workload), jobs=1)
    assert not any(x.startswith("bf16 on") for x in plain["explanation"])
