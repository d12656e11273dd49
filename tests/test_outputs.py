"""Output files are all or nothing, and a file that cannot be written is one line, exit 2."""

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.outputs.files import write_files

RUN = ["run", "-t", "2x5090", "-w", "gpt2-medium", "--seq-len", "256"]


def test_all_files_appear_with_the_usual_mode(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_files({a: lambda p: p.write_text("A"), b: lambda p: p.write_text("B")})
    assert a.read_text() == "A" and b.read_text() == "B"
    assert a.stat().st_mode & 0o644 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_failing_writer_leaves_no_file_at_all(tmp_path: Path) -> None:
    def boom(path: Path) -> None:
        path.write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match="cannot write .*b.txt: No space left"):
        write_files({tmp_path / "a.txt": lambda p: p.write_text("A"), tmp_path / "b.txt": boom})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where, message", [
    ("missing-folder/t.json", "no such folder"),
    (".", "it is a directory"),
])
def test_run_with_an_unwritable_trace(tmp_path: Path, where: str, message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--trace", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_one_bad_output_path_keeps_the_good_one_from_being_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "ok.json"
    assert main([*RUN, "--trace", str(good), "--gantt", str(tmp_path / "no" / "g.png")]) == 2
    assert not good.exists() and list(tmp_path.iterdir()) == []


def test_topo_png_to_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "-t", "2x5090", "--png", str(tmp_path / "no" / "t.png")]) == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["collective", "-t", "2x5090", "--op", "allreduce", "--bytes", "1M", "--gpus", "0"],
     "must be at least 1"),
    (["run", "-t", "8x5090-switch", "-w", "gpt2-medium", "-s", "tp", "--tp", "16"],
     "tensor-parallel size 16"),
    (["memory", "-t", ".", "-w", "gpt2-medium"], "is a directory"),
])
def test_bad_input_is_one_clear_line(argv: list[str], message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_gantt_idle_gaps_lie_between_a_lanes_spans() -> None:
    from simulator.outputs.plots import _idle

    bars = {"forward": [(0.0, 1.0), (5.0, 1.0)], "backward": [(1.5, 2.0), (2.0, 1.0)]}
    assert _idle(bars) == [(1.0, 0.5), (3.5, 1.5)]  # overlaps merged, no gap before or after
    assert _idle({}) == []


def test_pipeline_gantt_title_names_the_schedule_and_bubble(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    titles: list[str] = []
    real = plt.Axes.set_title

    def spy(self, label, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        titles.append(label)
        return real(self, label, *a, **k)

    monkeypatch.setattr(plt.Axes, "set_title", spy)
    assert main(["run", "-t", "8x5090-switch", "-w", "gpt2-medium", "-s", "ddp", "--pp", "2",
                 "--grad-accum", "4", "--gantt", str(tmp_path / "pp.png")]) == 0
    assert (tmp_path / "pp.png").stat().st_size > 0
    assert any("pp 2 1f1b x 4 micro-batches, bubble" in t for t in titles), titles
