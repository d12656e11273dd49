"""nccl-tests logs as users paste them: every real fixture reads, with its collective and GPUs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    ("hello\n", "no usable nccl-tests result row"),
    ("# nThread 1 nGpus 2\n#  Rank  0 Group  0 Pid 1 on h device  0 [0x1a] G\n"
     "#  Rank  1 Group  0 Pid 1 on h device  1 [0x1b] G\n"
     "         8        2     float     sum      -1     8.97    0.00\n",
     r"no usable .* \(cut short \(7 of 13 fields\), line 4\)"),
    ("#  Rank  0 Group  0 Pid 1 on h device  0 [0x1a] G\n"
     "  8  2  float  sum  -1  8.97  0.00  0.00  0  8.83  0.00  0.00  0\n", "needs two or more"),
])
def test_bad_logs_are_one_clear_error(text, message):
    with pytest.raises(InputError, match=message):
        nccl_tests_log.parse(text, "x.log")


B12_AS_RUN = Path(__file__).parent / "fixtures" / "logs" / "B12-as-run.nccl-tests.log"


def test_the_command_line_and_nccls_own_lines_say_what_ran():
    log = nccl_tests_log.parse(B12_AS_RUN.read_text(), str(B12_AS_RUN))
    assert dict(log.env) == {"NCCL_P2P_DISABLE": "1"}
    assert log.visible_devices == (1, 2) and log.gpus == 2
    assert log.nccl_version == "2.16.2" and log.transports == {"SHM"}
    text = ("host:1:1 [0] NCCL INFO NCCL version 2.18.5+cuda12.2\n"
            "host:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS\n"
            "host:1:1 [0] NCCL INFO NCCL_MIN_NCHANNELS set by environment to 8.\n"
            "host:1:1 [0] NCCL INFO comm 0x5 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
            "host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
            "  1048576  262144  float  sum  -1  100.0  10.49  10.49  0  100.0  10.49  10.49  0\n")
    log = nccl_tests_log.parse(text)
    assert dict(log.env) == {"NCCL_P2P_LEVEL": "SYS", "NCCL_MIN_NCHANNELS": "8"}
    assert (log.nccl_version, log.gpus, log.transports) == ("2.18.5", 2, {"P2P"})


ROW = "  {size}  {count}  float  sum  -1  {t}  {a}  {b}  0  {t}  {a}  {b}  0"


def _rows(*cells: tuple[str, str, str]) -> str:
    head = "#  Rank  0 Group  0 Pid 1 on h device  0 [0x1a] G\n" \
           "#  Rank  1 Group  0 Pid 1 on h device  1 [0x1b] G\n"
    return head + "\n".join(ROW.format(size=size, count=int(size) // 4 if size.isdigit() else 1,
                                       t=t, a=a, b=a) for size, t, a in cells) + "\n"


@pytest.mark.parametrize("bad, why", [
    (("1048576", "N/A", "10.49"), "'N/A' is not a number"),
    (("1048576", "-inf", "10.49"), "'-inf' is not a number"),
    (("1048576", "1e-308", "0.00"), "disagrees with its algbw"),
    (("0x10", "100.0", "10.49"), "is not an integer"),
    (("1048576", "-5.0", "10.49"), "is not positive"),
    (("1048576", "100.0", "99.99"), "disagrees with its algbw"),
])
def test_a_bad_cell_costs_its_row_only(bad, why):
    good = ("2097152", "200.0", "10.49")
    log = nccl_tests_log.parse(_rows(good, bad, good), "x.log")
    assert len(log.rows) == 2 and len(log.skipped) == 1
    line, reason = log.skipped[0]
    assert line == 4 and why in reason
    assert "1 row(s) not used (line 4: " in log.warning()


def test_a_cut_last_row_keeps_the_rest_and_duplicates_are_named():
    text = (REAL / "B8.nccl-tests.log").read_text().splitlines()
    last = next(k for k in range(len(text) - 1, 0, -1)
                if text[k].strip().startswith("1073741824"))
    text[last] = "  ".join(text[last].split()[:11])[:-2]  # the paste stopped in the in-place half
    text.insert(last, text[last - 1])  # and the 512 MiB row was pasted twice
    log = nccl_tests_log.parse("\n".join(text))
    assert log.rows[-1].bytes == 1 << 30 and log.rows[-1].in_place_time_us is None
    assert log.duplicates == (1 << 29,)
    assert "measured more than once" in log.warning()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_logs_read_or_refuse_in_one_line(data):
    """Cells replaced, rows cut, rows duplicated: parse returns the rows that are whole or
    raises InputError, never anything else."""
    name = data.draw(st.sampled_from(sorted(EXPECTED)))
    lines = (REAL / f"{name}.nccl-tests.log").read_text().splitlines()
    for _ in range(data.draw(st.integers(0, 6))):
        k = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["cell", "cut", "dup", "drop"]))
        fields = lines[k].split()
        if action == "cell" and fields:
            i = data.draw(st.integers(0, len(fields) - 1))
            fields[i] = data.draw(st.sampled_from(JUNK))
            lines[k] = "  ".join(fields)
        elif action == "cut":
            lines[k] = lines[k][:data.draw(st.integers(0, max(0, len(lines[k]))))]
        elif action == "dup":
            lines.insert(k, lines[k])
        else:
            del lines[k]
    try:
        log = nccl_tests_log.parse("\n".join(lines), "fuzz.log")
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert log.rows and all(r.time_us > 0 and math.isfinite(r.time_us) for r in log.rows)


JUNK = ["N/A", "0x10", "-inf", "inf", "nan", "1e-308", "1e309", "-1", "", "#", "float", "9" * 40]
