"""`--deepspeed ds_config.json`: a DeepSpeed config's ZeRO stage, offload, batch and precision,
under the flags given (which win), on LLaMA-Factory's published example configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main
from simulator.engine.program import Comm
from simulator.errors import InputError
from simulator.inputs.deepspeed_config import settings

DS = Path(__file__).resolve().parent / "fixtures" / "deepspeed"
Z3 = str(DS / "ds_z3_offload_config.json")
Z2 = str(DS / "ds_z2_offload_config.json")


def test_zero3_offload_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "auto" batch and precision keep stepsim's defaults; overlap_comm false is warned, once
    copy = tmp_path / "ds_z3_offload_config.json"  # a path of its own: warnings show once
    copy.write_bytes(Path(Z3).read_bytes())
    assert settings(str(copy)) == {"strategy": "zero3", "offload": "params", "pin_memory": True}
    assert settings(str(copy)) == settings(Z3)
    mine = [e for e in capsys.readouterr().err.splitlines() if e.startswith(f"{copy}:")]
    assert len(mine) == 1 and "zero_optimization.overlap_comm: warning" in mine[0]


def test_zero2_offload_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings(Z2) == {"strategy": "zero2", "zero_overlap_comm": False,
                            "offload": "optimizer", "pin_memory": True}
    assert capsys.readouterr().err == ""  # 5e8-element buckets are stepsim's own


def _config(tmp_path: Path, data: dict[str, object]) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data, indent=2))
    return str(path)


def test_batch_precision_and_buckets(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    path = _config(tmp_path, {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
        "bf16": {"enabled": False}, "fp16": {"enabled": True},
        "zero_optimization": {"stage": 1, "overlap_comm": True, "reduce_bucket_size": 2e8}})
    assert settings(path) == {"strategy": "zero1", "zero_overlap_comm": True,
                              "reduce_bucket_size": 200_000_000, "micro_batch": 4,
                              "grad_accum": 8, "precision": "fp16"}
    assert capsys.readouterr().err == ""
    stage3 = _config(tmp_path, {"zero_optimization": {"stage": 3, "reduce_bucket_size": 2e8,
                                                      "allgather_bucket_size": 3e8}})
    # ZeRO-3 reduces in its buckets; absent, stage3_prefetch_bucket_size is DeepSpeed's 5e7
    assert settings(stage3) == {"strategy": "zero3", "reduce_bucket_size": 200_000_000,
                                "prefetch_bucket_size": 50_000_000}
    assert "allgather_bucket_size: warning: 300,000,000 elements: applied under ZeRO-1 and -2" \
        in capsys.readouterr().err
    auto = _config(tmp_path, {"zero_optimization": {
        "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}})
    assert settings(auto) == {"strategy": "zero3"}  # Hugging Face fills them in
    both_off = _config(tmp_path, {"bf16": {"enabled": False}, "fp16": {"enabled": False}})
    assert settings(both_off) == {"precision": "fp32"}


def test_bucket_sizes_cut_zero2_reductions_and_buffers(tmp_path: Path) -> None:
    # IPG buckets close before passing reduce_bucket_size elements; the updated 16-bit
    # partitions are all-gathered in allgather_bucket_size chunks (of the whole array)
    path = _config(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e8,
                                                    "allgather_bucket_size": 2e8}})
    spec = api.RunSpec("8x5090-dual-socket", "llama2-7b", deepspeed=path)
    small = api.simulate(spec, baseline=False)
    plain = api.simulate(api.RunSpec("8x5090-dual-socket", "llama2-7b", "zero2"), baseline=False)
    n = small.job.n_trainable

    def gathers(result: api.RunResult) -> int:
        return sum(isinstance(t.work, Comm) and t.work.name.startswith("allgather.params")
                   for t in result.programs[0].tasks)

    buckets = small.programs[0].meta["buckets"]  # 2-byte gradients; a tensor past the cap
    sizes = [b["bytes"] // 2 for b in buckets]  # (lm_head, 131M elements) is a bucket alone
    assert all(size <= 100_000_000 for size, b in zip(sizes, buckets, strict=True)
               if b["tensors"] > 1)
    assert len(sizes) >= -(-n // 100_000_000)
    assert len(plain.programs[0].meta["buckets"]) < len(sizes)
    assert gathers(small) == -(-n // 200_000_000) and gathers(plain) == -(-n // 500_000_000)
    assert small.report["recipe"]["reduce_bucket_size"] == 100_000_000
    assert "reduce_bucket_size" not in plain.report["recipe"]
    assert any("reduce_bucket_size 1e8" in line.label and line.bytes == 100_000_000 * 2
               for line in api.memory(spec).report.lines)


def test_the_spec_takes_the_file_where_flags_are_silent() -> None:
    spec = api.configured(api.RunSpec("8x5090-dual-socket", "llama2-7b", deepspeed=Z3))
    assert (spec.strategy, spec.offload, spec.pin_memory) == ("zero3", "params", True)
    job = api.job_of(api.RunSpec("1x4090", "llama2-7b", deepspeed=Z2, micro_batch=2))
    assert job.micro_batch == 2
    verdict = api.memory_of(api.RunSpec("8x5090-dual-socket", "llama2-7b", deepspeed=Z3))
    assert verdict["offload"] == "params" and verdict["strategy"] == "zero3"


def test_explicit_flags_win(tmp_path: Path) -> None:
    flags = api.RunSpec("8x5090-dual-socket", "llama2-7b", strategy="ddp", deepspeed=Z2,
                        explicit=frozenset({"strategy"}))
    spec = api.configured(flags)  # -s ddp given: the file's ZeRO settings do not apply
    assert (spec.strategy, spec.offload, spec.zero_overlap_comm) == ("ddp", "none", None)
    path = _config(tmp_path, {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}})
    spec = api.configured(api.RunSpec("1x4090", "llama2-7b", micro_batch=1, precision="fp32",
                                      deepspeed=path))
    assert (spec.micro_batch, spec.precision) == (1, "fp32")


def test_cli_flags_win_over_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "-t", "8x5090-dual-socket", "-w", "llama3.2-1b", "--no-ranges", "--json",
            "--deepspeed", Z2]
    assert main(base) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "zero2" and report["recipe"]["offload"] == "optimizer"
    assert report["config_files"]["deepspeed"] == Z2
    assert main([*base, "-s", "zero1", "--offload", "none", "--micro-batch", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "zero1" and report["recipe"]["offload"] == "none"
    assert report["micro_batch"] == 2


@pytest.mark.parametrize(("data", "key", "words"), [
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "ZeRO stage 4"),
    ({"zero_optimization": {"stage": "3"}}, "zero_optimization.stage", "expected an integer"),
    ({"zero_optimization": {"offload_param": {"device": "nvme"}}},
     "zero_optimization.offload_param.device", "NVMe offload is not modelled"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu",
     "must be at least 1"),
    ({"bf16": {"enabled": "yes"}}, "bf16.enabled", "expected true or false"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "fp16.enabled", "both enabled"),
])
def test_bad_deepspeed_configs_are_one_line(tmp_path: Path, data: dict[str, object],
                                            key: str, words: str) -> None:
    path = _config(tmp_path, data)
    with pytest.raises(InputError) as err:
        settings(path)
    leaf = key.rsplit(".", 1)[-1]
    lines = Path(path).read_text().splitlines()
    line = max(i for i, text in enumerate(lines, 1) if f'"{leaf}"' in text)
    assert (err.value.file, err.value.line, err.value.key) == (path, line, key)
    assert words in err.value.message


def test_unknown_keys_warn_and_bad_json_fails(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, {"zero_optimisation": {"stage": 2}, "bf16": {"enabld": True}})
    assert settings(path) == {}
    err = capsys.readouterr().err.splitlines()
    assert [e.split(": ", 2)[1] for e in err] == ["zero_optimisation", "bf16.enabld"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3}\n "bf16": {}}\n')
    assert main(["memory", "-t", "1x4090", "-w", "llama2-7b", "--deepspeed", str(bad)]) == 2
    out = capsys.readouterr().err.strip()
    assert f"{bad}:2: invalid JSON" in out and "\n" not in out


def test_a_config_whose_later_check_fails_says_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt ``stage`` warns when read, and its offload then cannot apply to the default
    -s ddp: the command ends in the error's one line, the warning that led there dropped; a
    command that succeeds still prints its warnings (after its output)."""
    path = _config(tmp_path, {"zero_optimization": {"stag": 2,
                                                    "offload_optimizer": {"device": "cpu"}}})
    assert main(["memory", "-t", "2x5090", "-w", "gpt2-medium", "--deepspeed", path]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"stepsim memory: error: {path}: zero_optimization: its offload")
    assert "(the file gives no stage)" in line
    assert main(["memory", "-t", "2x5090", "-w", "gpt2-medium", "--deepspeed", path,
                 "-s", "zero2"]) == 0
    captured = capsys.readouterr()
    assert "fits" in captured.out and "zero_optimization.stag: warning: unknown key" in captured.err
