"""compare --png: stacked compute / exposed communication / idle per run, ranges as whiskers."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.outputs import plots


def test_compare_draws_one_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "compare.png"
    assert main(["compare", "-t", "2x5090", "-t", "2x3090ti-nvlink", "-w", "gpt2-medium",
                 "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "range set by" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:No artists with labels")  # the bars are stubbed out
def test_the_bars_split_each_step_into_compute_exposed_and_idle(tmp_path: Path,
                                                                monkeypatch) -> None:
    drawn: dict = {}

    def bar(self, xs, heights, bottom=None, **kw):  # noqa: ANN001, ANN202
        drawn.setdefault(kw.get("label", "tokens"), list(heights))

    monkeypatch.setattr("matplotlib.axes.Axes.bar", bar)
    reports = [{"compute_time_s": 0.8, "exposed_comm_s": 0.1, "step_time_s": 1.0,
                "tokens_per_s": 10.0},
               {"compute_time_s": 0.5, "exposed_comm_s": 0.3, "step_time_s": 0.9,
                "tokens_per_s": 12.0}]
    plots.compare_chart(["a", "b"], reports, tmp_path / "c.png")
    assert drawn["compute"] == [0.8, 0.5] and drawn["exposed communication"] == [0.1, 0.3]
    assert drawn["idle"] == pytest.approx([0.1, 0.1])
