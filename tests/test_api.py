"""simulator.api, the entry point every command calls: typed picklable specs and results,
the same answers as the commands, and a sweep fanned out over Dask (skipped without it)."""

from __future__ import annotations

import ast
import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main

ROOT = Path(__file__).resolve().parent.parent

SPEC = api.RunSpec("2x5090", "gpt2-medium", "ddp", seq_len=256)


def test_specs_and_results_pickle() -> None:
    result = api.simulate(SPEC)
    for obj in (SPEC, result, api.memory(SPEC),
                api.collective(api.CollectiveSpec("2x5090", "allreduce", (1024, 1 << 20)))):
        again = pickle.loads(pickle.dumps(obj))
        assert type(again) is type(obj)
    assert pickle.loads(pickle.dumps(result)).report == result.report
    assert hash(SPEC) == hash(replace(SPEC))


def test_run_is_simulate_report() -> None:
    assert api.run(SPEC) == api.simulate(SPEC).report


def test_memory_is_the_memory_simulate_reports() -> None:
    for strategy in ("ddp", "fsdp", "zero2", "tp"):
        spec = replace(SPEC, strategy=strategy)
        assert api.memory(spec).summary["peak_bytes"] == \
            api.simulate(spec).report["memory"]["peak_bytes"], strategy


def test_the_commands_print_what_the_api_returns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "2x5090", "-w", "gpt2-medium", "--seq-len", "256",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_bytes"] == \
        api.memory(SPEC).summary["peak_bytes"]
    assert main(["collective", "-t", "2x5090", "--op", "allreduce", "--bytes", "1M",
                 "--json"]) == 0
    (one,) = api.collective(api.CollectiveSpec("2x5090", "allreduce", (1 << 20,)))
    assert json.loads(capsys.readouterr().out)["time_us"] == one.time_us


def test_memory_searches_through_the_api() -> None:
    found = api.memory(replace(SPEC, micro_batch=None), largest_micro_batch=True)
    best = found.summary["largest_micro_batch"]
    assert best >= 1
    assert api.memory(replace(SPEC, micro_batch=best)).report.fits
    assert not api.memory(replace(SPEC, micro_batch=best + 1)).report.fits


COMMANDS = Path(__file__).resolve().parent.parent / "simulator" / "commands"
# what the simulation is made of: a command reaches it through api, not on its own
INTERNALS = ("simulator.engine", "simulator.strategies.ddp", "simulator.strategies.fsdp",
             "simulator.strategies.tensor", "simulator.strategies.zero", "simulator.job.workload",
             "simulator.job.compute", "simulator.inputs.config", "simulator.outputs.report")
# these two convert a user's files into a topology and check it as they write it
OWN_PIPELINE = ("topo_import.py", "calibrate.py")


@pytest.mark.parametrize("module", sorted(p.name for p in COMMANDS.glob("*.py")))
def test_commands_reach_the_simulation_only_through_api(module: str) -> None:
    if module in OWN_PIPELINE:
        pytest.skip("checks a topology it has just converted")
    tree = ast.parse((COMMANDS / module).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith(INTERNALS)}, module


def test_a_sweep_on_dask_matches_the_serial_one() -> None:
    bag = pytest.importorskip("dask.bag")
    specs = [replace(SPEC, bucket_mb=mb) for mb in (1, 25, 100)]
    reports = bag.from_sequence(specs, npartitions=2).map(api.run).compute(
        scheduler="processes", num_workers=2)
    assert [r["step_time_s"] for r in reports] == [api.run(s)["step_time_s"] for s in specs]


def test_advise_on_a_local_dask_cluster_gives_the_serial_answer(tmp_path: Path) -> None:
    """The candidates on two Dask workers: the same ranking, pick and words as one process.
    The cluster runs in a script of its own: its threads would outlive it in this process
    (and keep the fork tests from running)."""
    pytest.importorskip("distributed", reason="distributed is not installed "
                        "(pip install 'stepsim[dask]')")
    script = tmp_path / "on_dask.py"
    script.write_text(
        "import json\n"
        "from distributed import Client, LocalCluster\n"
        "from simulator import api\n"
        "if __name__ == '__main__':\n"
        "    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)"
        " as cluster, Client(cluster) as client:\n"
        "        answer = api.advise(['1x4090'], 'gpt2-medium',"
        " executor=client.get_executor())\n"
        "    print(json.dumps(answer))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    spread = json.loads(done.stdout)
    serial = api.advise(["1x4090"], "gpt2-medium", jobs=1)
    assert [c["label"] for c in spread["candidates"]] == [c["label"] for c in serial["candidates"]]
    assert spread["best"] == json.loads(json.dumps(serial["best"]))
    # the words too, but the first line's wall time and where it ran
    assert spread["explanation"][1:] == serial["explanation"][1:]
