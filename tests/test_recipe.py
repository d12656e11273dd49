"""Training recipes: framework bundles, explicit keys over them, the flags, the printed recipe."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.inputs.config import load_workload
from simulator.inputs.schema import TrainingConfig
from simulator.job import recipe
from simulator.job.workload import Job


def test_no_framework_means_hugging_face_defaults() -> None:
    r = recipe.resolve(TrainingConfig(seq_len=8))
    assert (r.framework, r.kernels, r.cross_entropy, r.precision, r.optimizer,
            r.activation_checkpointing) == ("hf", "eager", "fp32", "bf16", "adamw", "none")
    assert r.optimizer_impl == "fused" and set(r.from_bundle) == set(recipe.KEYS)


@pytest.mark.parametrize("framework", recipe.FRAMEWORKS)
def test_a_bundle_sets_what_the_workload_leaves_out(framework: str) -> None:
    bundle = recipe.bundle(framework)
    r = recipe.resolve(TrainingConfig(seq_len=8, framework=framework))  # type: ignore[arg-type]
    assert all(getattr(r, k) == bundle[k] for k in recipe.KEYS)
    explicit = recipe.resolve(TrainingConfig(seq_len=8, framework=framework,  # type: ignore[arg-type]
                                             precision="fp32", kernels="fused"))
    assert explicit.precision == "fp32" and explicit.kernels == "fused"
    assert "precision" not in explicit.from_bundle and "kernels" not in explicit.from_bundle


def test_torchtitan_and_torchtune_ship_what_their_configs_say() -> None:
    titan = recipe.bundle("torchtitan")
    assert titan["activation_checkpointing"] == "op" and titan["optimizer_impl"] == "foreach"
    assert titan["compile_loss"] is False  # train.py: loss_fn is never compiled
    tune = recipe.bundle("torchtune")
    assert (tune["cross_entropy"], tune["precision"]) == ("chunked", "pure-bf16")


def test_the_job_reads_its_recipe() -> None:
    job = Job.from_config(load_workload("llama3-8b").with_training(framework="torchtune"))
    assert job.precision == "pure-bf16" and job.grad_bytes == 2
    assert job.checkpointing == "full" and job.kernels == "eager"


def test_run_prints_the_recipe_and_flags_override_it(capsys: pytest.CaptureFixture[str]) -> None:
    # llama3.2-1b leaves its checkpointing to the framework (llama3-8b's preset names full)
    args = ["run", "-t", "8xh100-nvswitch", "-w", "llama3.2-1b", "-s", "fsdp", "--no-ranges"]
    assert main(args + ["--framework", "torchtitan", "--kernels", "compiled", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["recipe"]
    assert rec["framework"] == "torchtitan" and rec["kernels"] == "compiled"
    assert rec["activation_checkpointing"] == "op" and rec["precision"] == "bf16"
    assert "activation_checkpointing" in rec["from_framework"]
    assert "kernels" not in rec["from_framework"]
    assert main(args + ["--optimizer", "adamw-8bit", "--precision", "pure-bf16"]) == 0
    out = capsys.readouterr().out
    assert "hf: eager kernels, sdpa attention, fp32 cross-entropy, pure-bf16, adamw-8bit" in out


def test_the_recipe_line_names_apex_amp_and_apex_ddp(capsys: pytest.CaptureFixture[str]) -> None:
    # bert-large-squad runs NVIDIA's run_squad.py: amp O2 and apex.parallel.DistributedDataParallel
    args = ["run", "-t", "8xa100-nvswitch", "-w", "bert-large-squad", "-s", "ddp", "--no-ranges"]
    assert main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("recipe"))
    assert line.endswith("fp16, adamw, apex amp O2, apex DDP, checkpointing none")
    assert main(["run", "-t", "8xa100-nvswitch", "-w", "llama3.2-1b", "-s", "ddp"]) == 0
    assert "apex" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["memory", "compare", "sweep"])
def test_every_command_takes_the_recipe_flags(command: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, "-t", "8xh100-nvswitch", "-w", "llama3-8b", "-s", "fsdp",
            "--cross-entropy", "chunked", "--checkpointing", "op"]
    if command == "sweep":
        argv += ["--gpus", "8", "--no-ranges"]
    if command == "compare":
        argv += ["--no-ranges"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "chunked cross-entropy" in out and "checkpointing op" in out


def test_an_unknown_recipe_value_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "2x5090", "-w", "llama3-8b", "--framework", "jax"]) == 2
    err = capsys.readouterr().err
    assert "--framework: expected one of hf, torchtune" in err and len(err.splitlines()) == 1
