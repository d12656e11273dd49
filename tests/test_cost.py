"""Cost arithmetic: hourly price of the GPUs used, per step, per token, a whole run, break-even."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.outputs import cost
from simulator.outputs.cost import Prices


def priced(**kw: object) -> tuple[dict, dict]:
    args: dict = dict(step_time_s=2.0, tokens_per_s=10_000.0, gpus=8, machine_gpus=8,
                      prices=Prices(), machine_usd_per_hour=None, card_price_usd=None,
                      card_price_source=None, avg_power_w=None)
    args.update(kw)
    return cost.run_cost(**args)


def test_a_gpu_hour_price_is_charged_for_the_gpus_used() -> None:
    c, basis = priced(prices=Prices(usd_per_gpu_hour=2.0), gpus=4)
    assert c["usd_per_hour"] == pytest.approx(8.0)
    assert c["usd_per_step"] == pytest.approx(8.0 / 3600 * 2.0)
    assert c["usd_per_million_tokens"] == pytest.approx(8.0 / 3600 / 10_000 * 1e6)
    assert "--price-per-gpu-hour" in basis["usd_per_hour_source"]


def test_the_machine_price_is_shared_by_its_gpus_and_the_flag_overrides_it() -> None:
    c, _ = priced(machine_usd_per_hour=16.0, gpus=1)
    assert c["usd_per_hour"] == pytest.approx(2.0)  # one of eight GPUs: an eighth of the box
    c, _ = priced(machine_usd_per_hour=16.0, prices=Prices(usd_per_gpu_hour=1.0))
    assert c["usd_per_hour"] == pytest.approx(8.0)


def test_every_cost_key_is_there_and_null_without_a_price() -> None:
    c, _ = priced()
    assert tuple(c) == cost.COST_KEYS
    assert all(v is None for v in c.values())


def test_a_whole_run_takes_its_tokens_over_the_throughput() -> None:
    c, _ = priced(prices=Prices(usd_per_gpu_hour=1.0, train_tokens=2 * 10**9))
    assert c["time_to_train_s"] == pytest.approx(2e9 / 1e4)
    assert c["usd_to_train"] == pytest.approx(8.0 * 2e5 / 3600)
    assert c["train_tokens"] == 2 * 10**9


def test_breakeven_is_purchase_over_monthly_saving() -> None:
    # rent $8/h, 2 kW at $0.25/kWh = $0.5/h, half the month in use: $7.5 x 365 h saved a month
    c, basis = priced(prices=Prices(usd_per_gpu_hour=1.0, purchase_usd=27_375.0,
                                    usd_per_kwh=0.25, utilization=0.5), avg_power_w=2000.0)
    assert basis["electricity_usd_per_hour"] == pytest.approx(0.5)
    assert c["breakeven_months"] == pytest.approx(27_375 / (7.5 * 365))
    c, basis = priced(prices=Prices(usd_per_gpu_hour=1.0), card_price_usd=2000.0,
                      card_price_source="launch MSRP", avg_power_w=1000.0)
    assert basis["purchase_usd"] == 16_000 and "launch MSRP" in basis["purchase_source"]
    assert c["breakeven_months"] is not None


def test_no_breakeven_when_electricity_costs_more_than_the_rent() -> None:
    c, _ = priced(prices=Prices(usd_per_gpu_hour=0.01, purchase_usd=1000.0, usd_per_kwh=1.0),
                  avg_power_w=5000.0)
    assert c["breakeven_months"] is None


def test_run_json_charges_one_gpu_of_a_priced_box(capsys: pytest.CaptureFixture[str]) -> None:
    # 8xh100-nvswitch.yaml carries price_usd_per_hour 22.32 for the whole machine
    assert main(["run", "-t", "8xh100-nvswitch", "-w", "gpt2-medium", "--gpus", "1",
                 "--train-tokens", "1B", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["cost"]["usd_per_hour"] == pytest.approx(22.32 / 8)
    assert r["cost"]["time_to_train_s"] == pytest.approx(1e9 / r["tokens_per_s"])
    assert r["cost"]["usd_to_train"] == pytest.approx(22.32 / 8 * 1e9 / r["tokens_per_s"] / 3600)


def test_price_flags_per_machine_in_compare(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "-t", "2x5090", "-t", "4x5090", "-w", "gpt2-medium",
                 "--price-per-gpu-hour", "0.5", "--price-per-gpu-hour", "0.7", "--json"]) == 0
    two, four = json.loads(capsys.readouterr().out)
    assert two["cost"]["usd_per_hour"] == pytest.approx(1.0)
    assert four["cost"]["usd_per_hour"] == pytest.approx(2.8)


@pytest.mark.parametrize("flags", [["--price-per-gpu-hour", "-1"], ["--train-tokens", "lots"],
                                   ["--utilization", "1.5"], ["--usd-per-kwh", "x"]])
def test_bad_price_flags_are_one_line(flags: list[str], capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flags[0] in err


def test_every_catalog_card_price_names_its_source_and_date() -> None:
    from simulator.catalog.gpus import GPUS, PRICE_SOURCES

    priced = {name for name, gpu in GPUS.items() if gpu.price_usd}
    assert priced <= set(PRICE_SOURCES)
    assert all(any(ch.isdigit() for ch in PRICE_SOURCES[n]) for n in priced)  # a year at least
