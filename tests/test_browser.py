"""The HTML report and `stepsim serve`'s page in a real browser: headless Chromium driven by
Selenium (the `browser` extra; Debian's `chromium` and `chromium-driver`, no browser download).

Checks that the page's table shows every machine compared, that changing the micro-batch
moves the memory bar, that the padded-batches box adds `--padded`, that a pasted `topo -m` is
imported and a bad paste shows the very line the CLI prints, and that the report opens from
disk fetching nothing. Each saves a screenshot
in ``$STEPSIM_SCREENSHOTS`` (else a folder of the test run), listed at the end of the run.
The tests skip, saying why, only where no browser or driver is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulator.cli import main
from simulator.commands import serve

webdriver = pytest.importorskip(
    "selenium.webdriver",
    reason="selenium is not installed (pip install -e '.[browser]'; .ci/run installs it)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOPO = ROOT / "tests" / "fixtures" / "real-inputs" / "A1.topo.txt"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# headless Chromium that stays off the network: no background fetches, updates or sync
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1200,1400")


def _browser() -> tuple[str, str]:
    binary = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip(f"no headless browser here: chromium {'found' if binary else 'missing'}, "
                    f"chromedriver {'found' if driver else 'missing'} (Debian: apt-get install "
                    "chromium chromium-driver; .ci/run installs them where apt-get can)")
    return binary, driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    binary, driver_path = _browser()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: look nothing up online
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def page(browser: Any) -> Iterator[str]:
    """`stepsim serve` in a thread of this process: its address."""
    server, session = serve.serve(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        session.close()


class _Listing:
    """A plugin that lists the screenshots at the end of the run (so CI's log shows them)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        shots = sorted(self.folder.glob("*.png"))
        terminalreporter.write_sep("-", f"browser screenshots ({len(shots)})")
        for path in shots:
            terminalreporter.write_line(f"{path} ({path.stat().st_size:,} bytes)")


@pytest.fixture(scope="module")
def shots(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("STEPSIM_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    folder.mkdir(parents=True, exist_ok=True)
    request.config.pluginmanager.register(_Listing(folder), "stepsim-screenshots")
    return folder


def _shot(browser: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1200, min(max(int(height) + 40, 800), 4000))
    browser.save_screenshot(str(path))
    browser.set_window_size(1200, 1400)
    assert path.stat().st_size > 10_000
    return path


def _wait(browser: Any, condition: Any, seconds: float = 60) -> Any:
    return WebDriverWait(browser, seconds, poll_frequency=0.1).until(condition)


def _pick(browser: Any, *names: str) -> None:
    for name in names:
        box = browser.find_element(By.CSS_SELECTOR, f'#machines input[value="{name}"]')
        if not box.is_selected():
            box.click()


def _paste(browser: Any, element_id: str, text: str) -> None:
    """Text put in a box as a paste puts it (typing would turn its tabs into focus moves)."""
    browser.execute_script(
        "var e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input', {bubbles: true}));", element_id, text)


def _memory_text(browser: Any) -> str:
    return browser.find_element(By.ID, "memory-live").text


def test_the_table_shows_every_machine_compared(browser: Any, page: str, shots: Path) -> None:
    browser.get(page)
    machines = ("8x5090-switch", "8x5090-dual-socket", "8xh100-nvswitch")
    _pick(browser, *machines)
    _wait(browser, lambda b: _memory_text(b).count("GiB") >= 3)
    browser.find_element(By.ID, "run-compare").click()
    rows = _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#runs tbody tr"))
    labels = [r.find_element(By.TAG_NAME, "td").text for r in rows]
    assert sorted(labels) == sorted(machines)
    winner = browser.find_element(By.ID, "advice").text
    assert winner.startswith("winner: ")
    command = browser.find_element(By.ID, "result-command").text
    assert command.startswith("stepsim compare -t ")
    assert all(f"-t {m} " in command for m in machines)
    header = browser.find_element(By.CSS_SELECTOR, "#runs th:nth-child(4)")
    header.click()  # sorted by tokens/s, fewest first
    first = browser.find_element(By.CSS_SELECTOR, "#runs tbody tr td").text
    assert first in ("8x5090-switch", "8x5090-dual-socket")
    _shot(browser, shots, "serve-compare-three-machines")


def test_the_memory_bar_follows_the_micro_batch(browser: Any, page: str, shots: Path) -> None:
    browser.get(page)
    _pick(browser, "8x5090-switch")
    _wait(browser, lambda b: "GiB" in _memory_text(b))
    before = _memory_text(browser)
    _shot(browser, shots, "serve-memory-micro-batch-1")
    field = browser.find_element(By.ID, "micro_batch")
    field.send_keys("4")
    after = _wait(browser, lambda b: _memory_text(b) != before and _memory_text(b))

    def need(text: str) -> float:
        found = re.search(r"([\d.]+) of [\d.]+ GiB", text)
        assert found is not None, text
        return float(found.group(1))

    assert need(after) > need(before)
    assert "--micro-batch 4" in browser.find_element(By.ID, "live-command").text
    _shot(browser, shots, "serve-memory-micro-batch-4")


def test_the_padded_box_adds_the_flag_to_the_command(browser: Any, page: str,
                                                     shots: Path) -> None:
    browser.get(page)
    _pick(browser, "8x5090-switch")
    _wait(browser, lambda b: "GiB" in _memory_text(b))
    command = browser.find_element(By.ID, "live-command")
    assert "--padded" not in command.text
    browser.find_element(By.ID, "padded").click()
    _wait(browser, lambda b: "--padded" in b.find_element(By.ID, "live-command").text)
    _shot(browser, shots, "serve-padded-batches")


def test_a_pasted_topo_is_imported(browser: Any, page: str, shots: Path) -> None:
    browser.get(page)
    browser.find_element(By.CSS_SELECTOR, "#form details summary").click()
    _paste(browser, "topo-text", TOPO.read_text())
    browser.find_element(By.ID, "topo-import").click()
    box = _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR,
                                                    '#machines input[value="mybox"]'))
    assert box[0].is_selected()
    assert "imported from topo.txt" in browser.find_element(By.ID, "topo-yaml").text
    _wait(browser, lambda b: "mybox" in _memory_text(b))
    _shot(browser, shots, "serve-topo-imported")


def test_a_bad_paste_shows_the_line_the_cli_prints(browser: Any, page: str, shots: Path,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = "GPU0\tGPU1\nthis is not a matrix\n"
    (tmp_path / "topo.txt").write_text(bad)
    monkeypatch.chdir(tmp_path)
    assert main(["topo", "import", "topo.txt", "--gpu", "rtx4090", "--name", "bad", "-o",
                 "bad.yaml"]) == 2
    cli_line = capsys.readouterr().err.strip()
    browser.get(page)
    browser.find_element(By.CSS_SELECTOR, "#form details summary").click()
    _paste(browser, "topo-text", bad)
    browser.find_element(By.ID, "topo-name").clear()
    browser.find_element(By.ID, "topo-name").send_keys("bad")
    browser.find_element(By.ID, "topo-import").click()
    shown = _wait(browser, lambda b: b.find_element(By.ID, "err-topo").text)
    assert shown == cli_line
    # a field's error: the line `stepsim memory` prints, beside the micro-batch
    assert main(["memory", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "-s", "ddp",
                 "--micro-batch", "two"]) == 2
    cli_line = capsys.readouterr().err.strip()
    _pick(browser, "8x5090-switch")
    browser.find_element(By.ID, "micro_batch").send_keys("two")
    shown = _wait(browser, lambda b: b.find_element(By.ID, "err-micro_batch").text)
    assert shown == cli_line
    _shot(browser, shots, "serve-error")


def test_the_report_opens_from_disk_and_fetches_nothing(browser: Any, shots: Path,
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    report = tmp_path / "cmp.html"
    assert main(["compare", "-t", "8x4090-dual-socket:4", "-t", "8xa100-nvswitch:1", "-w",
                 "llama2-7b-lora", "--html", str(report)]) == 0
    capsys.readouterr()
    browser.get(report.as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    assert [r.find_element(By.TAG_NAME, "td").text for r in rows] == [
        "8x4090-dual-socket:4", "8xa100-nvswitch:1"]
    assert browser.execute_script(
        "return performance.getEntriesByType('resource').length") == 0  # nothing fetched
    assert browser.find_element(By.ID, "advice").text.startswith("winner: 8x4090-dual-socket:4")
    _shot(browser, shots, "report-cmp-from-disk")

