"""`stepsim collective` prints nccl-tests' own layout: parsers written for real logs read it.

The three idioms public tools use are written out here and run on stepsim's output unchanged:
the `# Avg bus bandwidth` grep (FlagPerf's main.sh: grep | awk '{print $NF}'), superbench's
row parsing (cuda_nccl_bw_performance.py: the lines between the banner and `Out of bounds`,
busbw at field -6) and fixed 13-field rows. The banner is compared with a real log's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.outputs import nccl_tests

TURIN = str(Path(__file__).resolve().parent.parent / "validation" / "topologies"
            / "8xgb202-dual-turin-p2p.yaml")

REAL = Path(__file__).parent / "fixtures" / "real-inputs"


def collective(capsys, *argv: str) -> str:
    assert main(["collective", *argv]) == 0
    return capsys.readouterr().out


def avg_bus_bandwidth_grep(text: str) -> float:
    """grep "# Avg bus bandwidth" LOG | awk '{print $NF}'"""
    line = next(line for line in text.splitlines() if "# Avg bus bandwidth" in line)
    return float(line.split()[-1])


def superbench_max_busbw(text: str) -> float:
    """superbench: rows from 4 lines after 'out-of-place' to 'Out of bounds values'; stop at a
    short line; the out-of-place busbw is field -6; keep the largest."""
    content = text.splitlines()
    start = end = -1
    for index, line in enumerate(content):
        if "out-of-place" in line:
            start = index
        if "Out of bounds values" in line:
            end = index
    busbw = -1.0
    for line in content[start + 4:end]:
        fields = re.sub(r" +", " ", line.strip(" ")).split(" ")
        if len(fields) <= 10:
            break
        busbw = max(busbw, float(fields[-6]))
    return busbw


def thirteen_field_rows(text: str) -> list[tuple[int, float, float]]:
    """Rows are the non-comment lines of 13 fields: (size, out-of-place time, busbw)."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if not line.startswith("#") and len(fields) == 13:
            rows.append((int(fields[0]), float(fields[5]), float(fields[7])))
    return rows


def test_the_three_parser_idioms_read_stepsim_output(capsys):
    out = collective(capsys, "-t", "8x5090-switch-p2p", "--op", "allreduce", "-b", "8", "-e",
                     "1G", "-f", "2")
    rows = thirteen_field_rows(out)
    assert [size for size, _, _ in rows] == [8 << k for k in range(28)]
    busbw = [b for _, _, b in rows]
    assert avg_bus_bandwidth_grep(out) == pytest.approx(sum(busbw) / len(busbw), rel=1e-4)
    assert superbench_max_busbw(out) == max(busbw[1:])  # its +4 skips the first row
    assert all(line.startswith("#") or len(line.split()) == 13 for line in out.splitlines())


def test_banner_and_footer_match_a_real_log(capsys):
    real = (REAL / "B8.nccl-tests.log").read_text().splitlines()
    out = collective(capsys, "-t", "2x2080ti-switch", "--op", "all_reduce_perf", "-b", "8",
                     "-e", "1024M", "-f", "2", "-g", "2").splitlines()
    banner = [i for i, line in enumerate(real) if "out-of-place" in line][0]
    mine = [i for i, line in enumerate(out) if "out-of-place" in line][0]
    assert [x.rstrip() for x in out[mine:mine + 3]] == [x.rstrip() for x in
                                                        real[banner:banner + 3]]
    assert out[0] == real[1]  # the same preamble for the same command line
    assert out[2] == "# Using devices"
    assert out[out.index("# Out of bounds values : 0 OK") + 1].startswith("# Avg bus bandwidth")
    row, real_row = out[mine + 3], real[banner + 3]
    assert [m.span() for m in re.finditer(r"\S+", row)][:5] == [
        m.span() for m in re.finditer(r"\S+", real_row)][:5]  # same columns for 8 B


def test_time_formats_follow_nccl_tests():
    rows = [nccl_tests.Row(8, 2, t, 0.0, 0.0) for t in (12.25, 279.5, 268588.0)]
    text = nccl_tests.render(nccl_tests.Header(2, 8, 8, 2, True), "allreduce", "float", "sum",
                             rows, [])
    times = [line.split()[5] for line in text.splitlines() if not line.startswith("#")]
    assert times == ["12.25", "279.5", "268588"]


def test_datatype_sets_count_and_alignment(capsys):
    half = collective(capsys, "-t", "8x5090-switch", "--op", "allgather", "-b", "1K", "-d",
                      "half")
    fields = next(line for line in half.splitlines() if not line.startswith("#")).split()
    # 1024 B of half = 512 elements; all-gather: per-rank count in multiples of 4 over 8 ranks
    assert fields[:5] == ["1024", "64", "half", "none", "-1"]
    small = collective(capsys, "-t", "2x2080ti-switch", "--op", "all_gather_perf", "-b", "8")
    assert next(line for line in small.splitlines() if not line.startswith("#")).split()[:2] \
        == ["0", "0"]  # as the real all_gather log B9 prints its 8 B row


def test_redop_root_check_and_step_bytes(capsys):
    out = collective(capsys, "-t", "2x2080ti-switch", "--op", "reducescatter", "-b", "1M",
                     "-e", "3M", "-i", "1M", "-o", "max", "-c", "0")
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert [r[0] for r in rows] == ["1048576", "2097152", "3145728"]
    assert {r[3] for r in rows} == {"max"} and {r[8] for r in rows} == {"N/A"}
    assert "step: 1048576(bytes)" in out and "validation: 0" in out
    bcast = collective(capsys, "-t", "2x2080ti-switch", "--op", "broadcast_perf", "-b", "1M")
    assert next(line for line in bcast.splitlines() if not line.startswith("#")).split()[3:5] \
        == ["none", "0"]


def test_ignored_flags_are_said_once(capsys):
    out = collective(capsys, "-t", "8x5090-switch", "-t", "1", "--op", "allreduce", "-b", "1M",
                     "-g", "8", "-n", "50", "-w", "10", "-m", "1", "-N", "1", "-z", "0",
                     "-G", "0")
    said = [line for line in out.splitlines() if "ignored nccl-tests flags" in line]
    assert len(said) == 1
    for flag in ("-n 50", "-w 10", "-N 1", "-z 0", "-G 0"):
        assert flag in said[0]
    assert "-g 8" not in said[0] and "-g 8 x -t 1: 8 GPUs" in out  # -g and -t count the GPUs
    assert "warmup iters: 10 iters: 50" in out


def test_g_picks_the_gpus_of_each_process(capsys):
    """-g G runs G GPUs (nGpus G), as nccl-tests does; --gpus says the same, and the two must
    agree."""
    out = collective(capsys, "-t", "8x5090-switch", "--op", "allreduce", "-b", "1M", "-g", "4")
    assert "nGpus 4 " in out and "#  Rank  3" in out and "#  Rank  4" not in out


def test_stepsim_facts_are_comments_after_the_footer(capsys):
    out = collective(capsys, "-t", "8x5090-switch-p2p", "--op", "allreduce", "-b", "1G")
    lines = out.splitlines()
    footer = lines.index("#", lines.index("# Out of bounds values : 0 OK"))
    assert all(line.startswith("# stepsim: ") for line in lines[footer + 1:])
    assert any("Ring  Simple    4  P2P" in line for line in lines[footer + 1:])
    assert any("bottleneck at 1G" in line for line in lines[footer + 1:])
    out = collective(capsys, "-t", TURIN, "--op", "allreduce", "-b", "1G")
    assert "at 1G the 2 channels bind, not a link" in out  # 2 fallback channels of 256 threads


@pytest.mark.parametrize("argv, message", [
    (["-d", "float17"], "unknown datatype"), (["-o", "xor"], "unknown reduction"),
    (["--op", "hypercube_perf"], "unknown collective"), (["-t", "2x5090"], "exactly one -t"),
])
def test_bad_nccl_tests_flags_are_one_line(capsys, argv, message):
    base = ["collective", "-t", "8x5090-switch", "-b", "1M"]
    if "--op" not in argv:  # a flag given twice is an error of its own
        base += ["--op", "allreduce"]
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_g_uses_the_first_n_gpus_as_nccl_tests_does(capsys):
    """-g 2 on an 8-GPU topology: nccl-tests' 2 GPUs (per thread), the first two, said so."""
    out = collective(capsys, "-t", "8x5090-switch-p2p", "--op", "all_reduce_perf", "-b", "8",
                     "-e", "8G", "-f", "2", "-g", "2")
    assert out.startswith("# nThread 1 nGpus 2 ")
    assert out.count("rtx5090 (simulated)") == 2
    assert "-g 2: 2 GPUs, the first of 8x5090-switch-p2p in its order (gpu0, gpu1)" in out
    big = [line.split() for line in out.splitlines() if line.strip().startswith("8589934592")]
    assert float(big[0][7]) == pytest.approx(float(big[0][6]))  # busbw = algbw on 2 GPUs
    assert "ignored nccl-tests flags" not in out


def test_g_times_threads_and_a_contradicting_gpus(capsys):
    out = collective(capsys, "-t", "8x5090-switch", "-t", "2", "--op", "allreduce", "-g", "2")
    assert "nGpus 4" in out and "-g 2 x -t 2: 4 GPUs" in out
    assert main(["collective", "-t", "8x5090-switch", "--op", "allreduce", "-g", "2",
                 "--gpus", "4"]) == 2
    assert "-g 2 means 2 GPUs but --gpus says 4" in capsys.readouterr().err
