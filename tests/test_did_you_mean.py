"""A name that is almost right gets "did you mean": a near miss, another spelling, and a
framework's own name for a flag (its meaning, not its spelling)."""

from __future__ import annotations

import pytest

from simulator.cli import main
from simulator.commands import synonyms

RUN = ["run", "-t", "2x5090", "-w", "gpt2-medium"]


@pytest.mark.parametrize(("argv", "hint"), [
    (["--bucket_cap_mb", "25"], "did you mean --bucket-mb? (bucket_cap_mb in PyTorch DDP)"),
    (["--nproc-per-node", "4"], "did you mean --gpus? (nproc_per_node in torchrun)"),
    (["--tensor-model-parallel-size", "2"],
     "did you mean --tp? (tensor_model_parallel_size in Megatron)"),
    (["--per_device_train_batch_size", "4"], "did you mean --micro-batch?"),
    (["--gradient_checkpointing"], "did you mean --checkpointing full?"),
    (["--bukcet-mb", "3"], "did you mean --bucket-mb?"),  # a typo: its spelling
    (["-s", "zero-3"], "did you mean zero3?"),
    (["-s", "FullyShardedDataParallel"],
     "did you mean fsdp? (FullyShardedDataParallel in PyTorch)"),
    (["--checkpointing", "True"], "did you mean full? (True in Hugging Face"),
    (["--checkpointing", "ful"], "did you mean full?"),
])
def test_the_hint_names_the_flag_that_means_it(argv: list[str], hint: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and hint in err, err


@pytest.mark.parametrize(("argv", "hint"), [
    (["run", "-t", "8x5090-swtich", "-w", "gpt2-medium"], "did you mean 8x5090-switch?"),
    (["run", "-t", "2x5090", "-w", "llama-2-7b"], "did you mean llama2-7b?"),
    (["run", "-t", "8x4090", "-w", "gpt2-medium"], "did you mean 8x4090-dual-socket?"),
    (["run", "-t", "8x5090", "-w", "gpt2-medium"],
     "did you mean 8x5090-dual-socket, 8x5090-switch or 8x5090-switch-p2p?"),
    (["run", "-t", "2x5090", "-w", "gpt2-medium", "-s", "deepspeed"],
     "did you mean zero1, zero2 or zero3? (deepspeed in DeepSpeed, by ZeRO stage)"),
])
def test_presets_get_a_did_you_mean(argv: list[str], hint: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert hint in capsys.readouterr().err


def test_a_synonym_for_a_flag_the_command_lacks_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "2x5090", "-w", "gpt2-medium", "--bucket_cap_mb", "5"]) == 2
    assert "`stepsim memory` has no --bucket-mb" in capsys.readouterr().err


def test_every_synonym_points_at_a_flag_run_has() -> None:
    from simulator.cli import build_parser

    flags = {s for a in build_parser("run")._subparsers._group_actions[0]  # type: ignore[union-attr]
             .choices["run"]._actions for s in a.option_strings}
    for name, (ours, _) in synonyms.FLAGS.items():
        assert ours.split()[0] in flags, name


def test_a_hub_id_is_told_how_to_get_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    """stepsim reads no network: a Hugging Face Hub id is answered with the download of the
    one file it reads, in one line."""
    assert main(["run", "-t", "2x5090", "-w", "meta-llama/Llama-2-7b-hf"]) == 2
    err = capsys.readouterr().err
    assert "huggingface-cli download meta-llama/Llama-2-7b-hf config.json" in err
    assert len(err.strip().splitlines()) == 1
