"""The `stepsim` entry point: commands load only what they use, the program exits cleanly."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import cli
from simulator.commands import presets
from simulator.job import recipe

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "networkx", "simpy", "pydantic", "rich", "matplotlib")


# what a one-strategy run writing no file has no use for: the other strategies, the trace
# exporters, the regimes of other kernels, a collective timed alone, the memory searches,
# the flag suggestions, the median of a product line's GEMM rates (its cards have their own),
# arrays (the fabric's sums are plain floats); gzip comes with networkx, which the machine is
UNUSED_BY_AN_FSDP_RUN = (
    "simulator.strategies.ddp", "simulator.strategies.zero", "simulator.strategies.tensor",
    "simulator.strategies.paging", "simulator.strategies.buckets", "simulator.outputs.trace",
    "simulator.outputs.kineto", "simulator.job.compiled", "simulator.job.fused",
    "simulator.nccl.perf", "simulator.memory.search", "difflib", "statistics", "numpy")


def _imported_after(argv: list[str], modules: tuple[str, ...] = HEAVY, *,
                    at_a_terminal: bool = False) -> set[str]:
    """Which of ``modules`` a fresh interpreter has imported after `stepsim ARGV` (with
    ``at_a_terminal``: its stderr a terminal, out of CI, where progress may show)."""
    code = ("import io, contextlib, sys\n"
            "class Terminal(io.StringIO):\n"
            "    def isatty(self): return True\n"
            f"if {at_a_terminal}: sys.stderr = Terminal()\n"
            "from simulator.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})\n"
            f"print(' '.join(m for m in {modules!r} if m in sys.modules), file=sys.__stdout__)")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env)
    return set(out.stdout.split())


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_the_listed_help_line_is_the_one_the_command_registers(name: str) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    __import__(f"simulator.commands.{name}", fromlist=["add_parser"]).add_parser(sub)
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert helps == {name: cli.COMMANDS[name]}


def test_every_command_module_is_listed() -> None:
    modules = {p.stem for p in (ROOT / "simulator" / "commands").glob("*.py")}
    assert set(cli.COMMANDS) <= modules


def test_the_top_level_help_and_an_unknown_command_list_every_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["--help", "run"], ["-h", "presets", "--json"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        listed = capsys.readouterr().out
        assert all(f"    {name}" in listed for name in cli.COMMANDS), argv
    assert cli.main(["no-such-command"]) == 2
    error = capsys.readouterr().err
    assert all(f"'{name}'" in error for name in cli.COMMANDS)


def test_version_answers_without_argparse() -> None:
    assert _imported_after(["--version"], ("argparse", "json")) == set()


def test_presets_load_neither_the_models_nor_the_simulator() -> None:
    assert _imported_after(["presets", "--json"]) == set()


def test_json_output_does_not_load_rich() -> None:
    assert "rich" not in _imported_after(["collective", "-t", "2x5090", "--op", "allreduce",
                                          "--bytes", "1M", "--json"])


def test_a_short_run_at_a_terminal_does_not_load_rich_for_a_bar_it_never_shows() -> None:
    run = ["run", "-t", "2x5090", "-w", "gpt2-medium", "-s", "ddp", "--json"]
    assert "rich" not in _imported_after(run, at_a_terminal=True)


def test_a_run_loads_only_its_own_strategy_and_no_unasked_output() -> None:
    job = ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "--json"]
    assert _imported_after([*job, "-s", "fsdp"], UNUSED_BY_AN_FSDP_RUN) == set()
    # the same check sees a module the run does use (a job that fits: one that does not is
    # not simulated, so it loads no strategy)
    lora = ["run", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "--json"]
    assert {"simulator.strategies.ddp", "simulator.strategies.buckets"} <= _imported_after(
        [*lora, "-s", "ddp"], UNUSED_BY_AN_FSDP_RUN)


def test_the_fast_listing_is_what_the_validated_presets_say() -> None:
    from simulator.inputs.config import load_topology, load_workload, preset_names

    for name, line in zip(preset_names("topologies"), presets.listing()["topologies"],
                          strict=True):
        cfg = load_topology(name)
        gpus = sum(n.kind == 'gpu' for n in cfg.nodes) * cfg.nnodes  # every box's
        assert line["gpus"] == f"{gpus} x {cfg.gpu}"
    for name, line in zip(preset_names("workloads"), presets.listing()["workloads"],
                          strict=True):
        t = load_workload(name).training
        assert line["recipe"] == (f"{t.finetune}, seq {t.seq_len}, micro-batch "
                                  f"{t.micro_batch}, {recipe.resolve(t).precision}")


def _program(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True,
                          text=True, cwd=ROOT)


def test_the_program_prints_everything_and_exits_with_the_status() -> None:
    done = _program("presets", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["topologies"]
    assert _program("--version").stdout.startswith("stepsim ")
    bad = _program("run", "-t", "no-such-box", "-w", "gpt2-medium")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert _program("no-such-command").returncode == 2


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    done = subprocess.run(f"{sys.executable} -m simulator presets | head -1", shell=True,
                          capture_output=True, text=True, cwd=ROOT)
    assert done.stdout == "Topologies (-t):\n" and "Traceback" not in done.stderr


def test_the_program_keeps_what_it_loaded_out_of_the_collectors_scans(
        capsys: pytest.CaptureFixture[str]) -> None:
    import gc

    gc.unfreeze()
    assert cli.main(["presets"]) == 0 and gc.get_freeze_count() == 0  # a library call: nothing
    try:
        assert cli.main(["presets"], whole_process=True) == 0
        assert gc.get_freeze_count() > 0  # the `stepsim` program: what is loaded is frozen
    finally:
        gc.unfreeze()  # the test process goes on
    assert "Topologies" in capsys.readouterr().out
