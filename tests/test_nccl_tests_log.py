"""nccl-tests logs as users paste them: every real fixture reads, with its collective and GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.inputs import nccl_tests_log

REAL = Path(__file__).parent / "fixtures" / "real-inputs"
# fixture -> (collective, GPUs, rows, first size, last size)
EXPECTED = {
    "B2": ("allreduce", 6, 1, 33554432, 33554432),
    "B4": ("allreduce", 2, 29, 8, 2147483648), "B5": ("allreduce", 4, 29, 8, 2147483648),
    "B8": ("allreduce", 2, 28, 8, 1073741824), "B9": ("allgather", 2, 28, 0, 1073741824),
    "B10": ("allreduce", 2, 4, 1 << 30, 1 << 33), "B12": ("allreduce", 2, 4, 1 << 30, 1 << 33),
    "B13": ("allreduce", 4, 4, 1 << 30, 1 << 33), "B15": ("allreduce", 4, 4, 1 << 30, 1 << 33),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_real_log_reads(name):
    path = REAL / f"{name}.nccl-tests.log"
    log = nccl_tests_log.parse(path.read_text(), str(path))
    op, gpus, rows, first, last = EXPECTED[name]
    assert (log.op, log.gpus, len(log.rows)) == (op, gpus, rows)
    assert (log.rows[0].bytes, log.rows[-1].bytes) == (first, last)
    assert log.avg_busbw_gbps is not None  # every fixture has the footer


def test_both_halves_and_the_device_block():
    log = nccl_tests_log.parse((REAL / "B8.nccl-tests.log").read_text())
    row = log.rows[0]
    assert (row.time_us, row.in_place_time_us) == (12.25, 12.00)
    assert log.devices[1] == (1, "0000:b5:00", "NVIDIA GeForce RTX 2080 Ti")


def test_gpu_count_from_busbw_when_the_header_is_missing():
    # B13 has no `# Using devices`: 224.84 / 149.89 = 2(n-1)/n gives 4
    assert nccl_tests_log.parse((REAL / "B13.nccl-tests.log").read_text()).gpus == 4


def test_without_footer_and_with_nccl_info_lines():
    text = (REAL / "B4.nccl-tests.log").read_text()
    lines = [line for line in text.splitlines() if "Avg bus" not in line]
    lines.insert(8, "host:1:1 [0] NCCL INFO Channel 00/02 :    0   1")
    log = nccl_tests_log.parse("\n".join(lines))
    assert log.avg_busbw_gbps is None and len(log.rows) == 29


@pytest.mark.parametrize("text, message", [
    ("hello\n", "no nccl-tests result rows"),
    ("# nThread 1 nGpus 2\n#  Rank  0 Group  0 Pid 1 on h device  0 [0x1a] G\n"
     "#  Rank  1 Group  0 Pid 1 on h device  1 [0x1b] G\n"
     "         8        2     float     sum      -1     8.97    0.00\n", "a result row with 7"),
    ("#  Rank  0 Group  0 Pid 1 on h device  0 [0x1a] G\n"
     "  8  2  float  sum  -1  8.97  0.00  0.00  0  8.83  0.00  0.00  0\n", "needs two or more"),
])
def test_bad_logs_are_one_clear_error(text, message):
    with pytest.raises(InputError, match=message):
        nccl_tests_log.parse(text, "x.log")
