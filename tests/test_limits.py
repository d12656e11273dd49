"""Absurd inputs end quickly with one line: load-time limits, flag limits, the stalled clock.

The limits themselves are in simulator/inputs/schema.py and docs/inputs.md ("Limits");
tests/test_docs.py checks the two agree. Here: each kind of absurd input that used to hang
or raise a traceback now gives one InputError line before any work proportional to the
input is built (no program made, nothing simulated). Times are the CPU time of the in-process
call, with a generous bound: a shared machine's wall clock waits for other work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from simulator import engine, strategies
from simulator.cli import main
from simulator.engine.clock import StalledClock
from simulator.engine.program import Comm, Compute, Program
from simulator.inputs.config import preset_dir
from tests.test_engine import FakeNetwork

WORKLOADS = preset_dir("workloads")
TOPOLOGIES = preset_dir("topologies")

# (what, preset file, text to replace, replacement, key the error names, words)
FILE_CASES = [
    ("infinite FLOPs", "resnet50", "forward_flops_per_sample: 1335885824",
     "forward_flops_per_sample: .inf", "layers[1].forward_flops_per_sample", "finite"),
    ("1e25 FLOPs", "resnet50", "forward_flops_per_sample: 1335885824",
     "forward_flops_per_sample: 1e25", "layers[1].forward_flops_per_sample", "at most 1e+18"),
    ("nan activations", "resnet50", "activation_bytes_per_sample: 6422528",
     "activation_bytes_per_sample: .nan", "layers[0].activation_bytes_per_sample", "finite"),
    ("no layers", "resnet50", None, "layers: []", "layers", "at least 1"),
    ("1e20 tokens", "gpt2-medium", "seq_len: 1024", "seq_len: 1e20", "training.seq_len",
     "too large a number"),
    ("2**40 tokens", "gpt2-medium", "seq_len: 1024", "seq_len: 1099511627776",
     "training.seq_len", "at most 16,777,216"),
    ("100,000 layers", "gpt2-medium", "layers: 24", "layers: 100000", "model.layers",
     "at most 4,096"),
    ("huge integer", "gpt2-medium", "vocab: 50257", "vocab: " + "9" * 400, "model.vocab",
     "at most"),
    ("tokens per step", "gpt2-medium", "micro_batch: 5, grad_accum: 1",
     "micro_batch: 65536, grad_accum: 65536", "training", "tokens per GPU per step"),
    ("tiny bandwidth", "2x5090", "lanes: 16}", "lanes: 16, bandwidth_gb_per_s: 5e-324}",
     "links[0].bandwidth_gb_per_s", "at least 0.001"),
    ("boolean lanes", "2x5090", "lanes: 16}", "lanes: true}", "links[0].lanes",
     "expected a number"),
    ("nan latency", "2x5090", "lanes: 16}", "lanes: 16, latency_us: .nan}",
     "links[0].latency_us", "finite"),
]


def _write(tmp_path: Path, preset: str, old: str | None, new: str) -> Path:
    folder = TOPOLOGIES if (TOPOLOGIES / f"{preset}.yaml").exists() else WORKLOADS
    text = (folder / f"{preset}.yaml").read_text()
    if old is None:  # replace the whole layer list
        text = text.split("\nlayers:")[0] + f"\n{new}\n" + "training:" + \
            text.split("\ntraining:")[1]
    else:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / f"{preset}-broken.yaml"
    path.write_text(text)
    return path


CPU_BOUND_S = 5  # a refusal costs milliseconds; an input that is built or simulated, minutes


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The task counts of the programs `run` simulates (empty: nothing was built)."""
    sizes: list[int] = []
    build, simulate = strategies.build, engine.simulate

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        programs = build(*args, **kwargs)
        sizes.extend(len(p.tasks) for p in programs)
        return programs

    def recording_simulate(programs: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.extend(len(p.tasks) for p in (programs if isinstance(programs, list)
                                            else [programs]))
        return simulate(programs, *args, **kwargs)

    monkeypatch.setattr(strategies, "build", recording_build)
    monkeypatch.setattr(engine, "simulate", recording_simulate)
    return sizes


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    started = time.process_time()
    code = main(argv)
    return code, capsys.readouterr().err, time.process_time() - started


@pytest.mark.parametrize(("what", "preset", "old", "new", "key", "words"), FILE_CASES,
                         ids=[c[0] for c in FILE_CASES])
def test_absurd_file_values_are_refused_at_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], built: list[int], what: str,
        preset: str,
        old: str | None, new: str, key: str, words: str) -> None:
    path = _write(tmp_path, preset, old, new)
    is_topology = (TOPOLOGIES / f"{preset}.yaml").exists()
    argv = ["run", "-t", str(path) if is_topology else "2x5090",
            "-w", "gpt2-medium" if is_topology else str(path)]
    code, err, took = _run(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{path}:" in err and f": {key}: " in err and words in err, err
    assert built == [] and took < CPU_BOUND_S


FLAG_CASES = [
    (["--micro-batch", "1000000000"], "--micro-batch: at most 65,536"),
    (["--grad-accum", "100000"], "--grad-accum: at most 65,536"),
    (["--bucket-mb", "nan"], "--bucket-mb: expected a finite number"),
    (["--bucket-mb", "inf"], "--bucket-mb: expected a finite number"),
    (["--bucket-mb", "1e-300"], "--bucket-mb: must be between"),
    (["--seq-len", "1e20"], "--seq-len: expected a whole number"),
    (["--compute-slowdown", "nan"], "--compute-slowdown: must be in [0, 1]"),
    (["--micro-batch", "65536", "--grad-accum", "4096"], "tokens per GPU per step"),
]


@pytest.mark.parametrize(("flags", "words"), FLAG_CASES, ids=[" ".join(c[0]) for c in FLAG_CASES])
def test_absurd_flags_are_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                              built: list[int], flags: list[str],
                                              words: str) -> None:
    code, err, took = _run(["run", "-t", "2x5090", "-w", "gpt2-medium", *flags], capsys)
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert built == [] and took < CPU_BOUND_S


def test_long_gradient_accumulation_is_replayed_not_refused(
        capsys: pytest.CaptureFixture[str], built: list[int]) -> None:
    argv = ["run", "-t", "2x5090", "-w", "gpt2-medium", "--no-ranges", "--json"]
    assert _run([*argv, "--grad-accum", "3"], capsys)[0] == 0
    short = list(built)
    assert short  # the recorder sees what run builds
    built.clear()
    code, err, took = _run([*argv, "--grad-accum", "50000"], capsys)
    # one micro-step simulated and replayed: 50,000 micro-steps build what 3 do
    assert code == 0 and err == "" and built == short and took < 2 * CPU_BOUND_S


def test_a_micro_step_too_large_to_simulate_is_refused_with_its_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], built: list[int]) -> None:
    path = _write(tmp_path, "gpt2-medium", "layers: 24", "layers: 2000")
    code, err, took = _run(["run", "-t", "2x5090", "-w", str(path)], capsys)
    assert code == 2 and "2,000 layers" in err and "at most 5,000" in err, err
    assert built == [] and took < CPU_BOUND_S
    assert main(["memory", "-t", "2x5090", "-w", str(path)]) == 0  # memory has no such bound


def test_sweep_refuses_an_empty_list_item(capsys: pytest.CaptureFixture[str]) -> None:
    code, err, _ = _run(["sweep", "-t", "2x5090", "-w", "gpt2-medium", "--bucket-mb", "1,,5"],
                        capsys)
    assert code == 2 and "comma-separated" in err


# --- the engine's stalled-clock guard ------------------------------------------------------

def _machine(capacity: float) -> FakeNetwork:
    """Two GPUs on one link; a collective is one flow over it on one channel."""
    return FakeNetwork({"g0->g1": capacity}, channels=1)


def test_a_wait_below_the_clocks_resolution_is_an_error_not_a_spin() -> None:
    p = Program(world=2)
    first = p.add("compute", Compute("long", "forward", 1e12))  # the clock is now 1e12 s
    p.add("nccl", Comm("ar", "allreduce", 1_000, ((0, 1),)), deps=(first,))  # 1 us of work
    started = time.process_time()
    with pytest.raises(StalledClock, match="too long to simulate"):
        engine.simulate(p, _machine(1e9))
    assert time.process_time() - started < CPU_BOUND_S


def test_a_rate_too_small_to_finish_is_an_error() -> None:
    p = Program(world=2)
    p.add("nccl", Comm("ar", "allreduce", 10**9, ((0, 1),)))
    with pytest.raises(StalledClock, match="never end"):
        engine.simulate(p, _machine(5e-324))


def test_long_steps_with_interrupted_compute_still_finish() -> None:
    # a 1e6 s step whose compute is re-timed by collectives: round-off below the clock's
    # resolution counts as done rather than tripping the guard
    p = Program(world=2)
    p.add("compute", Compute("bwd", "backward", 1e6 + 1e-7))
    for i in range(5):
        p.add("nccl", Comm(f"ar{i}", "allreduce", 3, ((0, 1),)))
    t = engine.simulate(p, _machine(1.0))
    assert t.step_time == pytest.approx(1e6, rel=1e-6)
