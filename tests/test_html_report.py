"""--html: one self-contained page per answer (no network, no external script or font), with
the table, the pictures, the memory, the advice, the command and the JSON."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from simulator.cli import main


class _Page(HTMLParser):
    """What a page holds: its tags and attributes, table rows, text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: list[list[str]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        if tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _read(path: Path) -> tuple[str, _Page]:
    text = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    return text, page


def _self_contained(text: str, page: _Page) -> None:
    """Nothing is fetched: no script, style sheet, image or font from anywhere."""
    for tag, attrs in page.tags:
        assert "src" not in attrs, tag
        if tag == "link":
            raise AssertionError("a <link> would fetch")
        for value in attrs.values():
            assert not (value or "").startswith(("http:", "https:", "//")) or \
                value == "http://www.w3.org/2000/svg", (tag, value)  # SVG's namespace: a name
    assert "url(" not in text and "@import" not in text and "@font-face" not in text
    assert ('name', 'viewport') in [(k, v) for _, a in page.tags for k, v in a.items()]


def test_compare_writes_the_whole_answer(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp.html"
    argv = ["compare", "-t", "8x4090-dual-socket:4", "-t", "8xa100-nvswitch:1", "-w",
            "llama2-7b-lora", "--html", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    text, page = _read(out)
    _self_contained(text, page)
    runs = [r for r in page.rows if r]
    assert [r[0] for r in runs] == ["8x4090-dual-socket:4", "8xa100-nvswitch:1"]
    for row in runs:  # fits, step time with its range, tokens/s, $/M tokens, grade, months
        assert row[1].startswith("fits: ")
        assert re.fullmatch(r"[\d.]+ m?s \([\d.]+-[\d.]+\)", row[2])
        assert row[4].startswith("$") and row[5] in ("high", "medium", "low", "none")
        assert row[6].endswith("months")
    assert 'class="sortable"' in text and "stepsimBind" in text  # sorting and copying
    winner = next(line for line in printed.splitlines() if line.startswith("winner: "))
    assert winner in "".join(page.text)  # the advice and its why, as printed
    assert text.count("<svg") >= 4  # the step picture, memory, a Gantt per run
    words = "".join(page.text)
    assert "exposed communication" in words and "card's memory" in words
    command = "stepsim " + " ".join(argv)
    assert command in text
    block = re.search(r'<pre id="json">(.*?)</pre>', text, re.S)
    assert block is not None
    doc = json.loads(block.group(1).replace("&quot;", '"').replace("&#x27;", "'")
                     .replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert [r["gpus"] for r in doc] == [4, 1] and "gantt" not in doc[0]


def test_a_job_that_does_not_fit_shows_no_price(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nofit.html"
    assert main(["compare", "-t", "8x5090-switch", "-t", "8x5090-dual-socket", "-w",
                 "llama2-7b", "-s", "fsdp", "--checkpointing", "none", "--no-ranges",
                 "--html", str(out)]) == 0
    capsys.readouterr()
    text, page = _read(out)
    for row in (r for r in page.rows if r):
        assert row[1].startswith("DOES NOT FIT") and row[2] == "not simulated"
        assert not any("$" in cell for cell in row)
    assert "would fit with --checkpointing full" in text


@pytest.mark.parametrize("argv", [
    ["run", "-t", "2x5090", "-w", "gpt2-medium", "--no-ranges"],
    ["sweep", "-t", "2x5090", "-w", "gpt2-medium", "--bucket-mb", "5,25", "--no-ranges"],
    ["advise", "-t", "1x4090", "-w", "gpt2-medium", "--jobs", "1"],
])
def test_every_command_writes_its_page(argv: list[str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "page.html"
    assert main([*argv, "--html", str(out)]) == 0
    capsys.readouterr()
    text, page = _read(out)
    _self_contained(text, page)
    assert [r for r in page.rows if r] and "<svg" in text
    assert "stepsim " + " ".join([*argv, "--html", str(out)]) in text
    if argv[0] == "advise":
        assert "confidence: high" in text and "best (throughput)" in text
