"""bitsandbytes paged optimizers: which states live in managed memory (closed form), that they
never make a job "not fit", that states which fit move nothing, that states which do not fit
cross the host link in full both ways each step, that a slower link is never faster, the
host-RAM check, and the strategies refused. Ends with torchtune's 4090 row."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main
from simulator.job import optimizer

# a Llama whose embeddings, LM head and MLP matrices (256 x 1024) reach bitsandbytes' 1e5
# elements and whose attention matrices (256 x 256 = 65,536) and norms do not
WORKLOAD = """\
name: medium-llama
model: {family: llama, layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn_hidden: 1024,
        vocab: 32000, tie_embeddings: false}
training: {seq_len: 256, micro_batch: 1, framework: torchtune, optimizer: paged-adamw-8bit}
"""
PAGED_NUMEL = 2 * 32000 * 256 + 2 * 3 * 256 * 1024
PAGED_BYTES = 2 * PAGED_NUMEL  # 8-bit m and v
# what the rest of this job needs on the card at its peak is about 516 MiB: 0.55 GiB leaves
# room for the 34 MiB of states, 0.52 GiB does not
TOPOLOGY = """\
name: card{n}
gpu: {{base: rtx4090, memory_gib: {memory}}}
p2p: false
nodes:
  - {{id: cpu0, kind: cpu, memory_bandwidth_gb_per_s: 70, cores: 16, memory_gib: 128}}
  - {{id: gpu0, kind: gpu}}
links:
  - {{a: cpu0, b: gpu0, kind: pcie, gen: {gen}, lanes: {lanes}}}
"""


def files(tmp_path: Path, memory: float, gen: int = 4, lanes: int = 16) -> tuple[str, str]:
    n = len(list(tmp_path.iterdir()))  # a file per variant: files are cached by path
    topology, workload = tmp_path / f"card{n}.yaml", tmp_path / "medium.yaml"
    topology.write_text(TOPOLOGY.format(n=n, memory=memory, gen=gen, lanes=lanes))
    workload.write_text(WORKLOAD)
    return str(topology), str(workload)


def test_what_pages_is_the_states_of_tensors_of_1e5_elements_or_more() -> None:
    assert optimizer.paged_state_split("paged-adamw-8bit", 100_000, 0.0) == (
        100_000 * 8 / 256, 200_000)  # absmax on the device, 1-byte m and v paged
    assert optimizer.paged_state_split("paged-adamw-8bit", 99_999, 2.03125) == (
        99_999 * 2.03125, 0.0)
    assert optimizer.paged_state_split("paged-adamw", 100_000, 0.0) == (0.0, 800_000)
    assert optimizer.paged_state_split("adamw-8bit", 10**9, 2.03125) == (2.03125e9, 0.0)


def test_states_that_fit_move_nothing(tmp_path: Path) -> None:
    result = api.simulate(api.RunSpec(*files(tmp_path, 0.55)), baseline=False)
    paged = result.memory["paged_optimizer"]
    assert paged == {"bytes": PAGED_BYTES, "resident_bytes": PAGED_BYTES,
                     "paged_to_host_bytes": 0}
    assert "paging" not in result.report
    assert not any(getattr(t.work, "kind", "") in ("h2d", "d2h")
                   for t in result.programs[0].tasks)


def test_states_that_do_not_fit_all_cross_both_ways_every_step(tmp_path: Path) -> None:
    result = api.simulate(api.RunSpec(*files(tmp_path, 0.52)), baseline=False)
    mem = result.memory
    assert mem["fits"]  # managed states never make the verdict
    paged = mem["paged_optimizer"]
    free = mem["capacity_bytes"] - mem["peak_bytes"]
    assert paged["resident_bytes"] == free and paged["paged_to_host_bytes"] == PAGED_BYTES - free
    assert mem["host_peak_bytes"] == PAGED_BYTES - free  # host RAM holds what pages out
    # a cyclic sweep larger than the space left defeats LRU: every paged byte, each way
    paging = result.report["paging"]
    assert paging["h2d_bytes_per_gpu"] == paging["d2h_bytes_per_gpu"] == PAGED_BYTES
    assert paging["h2d_s"] > 0 and paging["d2h_s"] > 0


@pytest.mark.parametrize("slower", [{"gen": 3}, {"lanes": 8}, {"gen": 3, "lanes": 4}])
def test_a_slower_host_link_is_never_faster(tmp_path: Path, slower: dict[str, int]) -> None:
    fast = api.simulate(api.RunSpec(*files(tmp_path, 0.52)), baseline=False)
    slow = api.simulate(api.RunSpec(*files(tmp_path, 0.52, **slower)), baseline=False)
    assert slow.report["step_time_s"] > fast.report["step_time_s"]
    assert slow.report["paging"]["h2d_s"] > fast.report["paging"]["h2d_s"]


def test_memory_prints_where_the_states_are(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    topology, workload = files(tmp_path, 0.52)
    assert main(["memory", "-t", topology, "-w", workload]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fits: ") and "GiB paged to host RAM" in out
    assert "optimizer states in managed memory" in out


@pytest.mark.parametrize("flags", [["-s", "fsdp"], ["-s", "zero2"]])
def test_sharded_strategies_are_refused(tmp_path: Path, flags: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, workload = files(tmp_path, 0.52)
    assert main(["run", "-t", "2x5090", "-w", workload, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "modelled under -s ddp only" in err, err


def test_torchtune_4090_full_finetune_fits_and_pages_its_8bit_states() -> None:
    """pytorch/torchtune README at 30b8519e8: Llama 3.1 8B full fine-tune on one RTX 4090,
    18.9 GiB peak, 1,650 tokens/s (validation/frameworks.yaml; within 20%)."""
    workload = str(Path(__file__).resolve().parent.parent / "validation" / "workloads"
                   / "torchtune-llama3.1-8b-4090.yaml")
    result = api.simulate(api.RunSpec("1x4090", workload), baseline=False)
    norms = 65 * 4096  # 2 per block and the final norm: under 1e5 elements, not paged
    assert result.report["paging"]["h2d_bytes_per_gpu"] == 2 * (8_030_261_248 - norms)
    assert result.memory["fits"]
    assert result.memory["peak_allocated_bytes"] / 2**30 == pytest.approx(18.9, rel=0.20)
    assert result.report["tokens_per_s_per_gpu"] == pytest.approx(1650, rel=0.20)


def test_the_memory_picture_leaves_the_managed_states_out(tmp_path: Path) -> None:
    from simulator.outputs import memory_plot

    result = api.simulate(api.RunSpec(*files(tmp_path, 0.52)), baseline=False)
    times = [result.timeline.step_time * i / 99 for i in range(100)]
    bands = memory_plot.memory_over_step(result.timeline, result.memory["lines"], times)
    assert max(bands["optimizer"]) < PAGED_BYTES / 10  # only the absmax and the small tensors
