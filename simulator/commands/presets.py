"""`stepsim presets`: the bundled machines and jobs, one line each, to pick a -t and a -w."""

from __future__ import annotations

import argparse
from typing import Any

from simulator.api import (
    listing as catalog,  # the presets' YAML as written: no models, no simulator
)
from simulator.outputs import jsondoc


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "presets", help="list the bundled topologies and workloads",
        description="List the bundled topologies (-t) and workloads (-w) with what each stands "
        "for. Any of them can be copied as a starting point for your own YAML.")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def _first_sentence(text: str, limit: int = 90) -> str:
    """The description's first sentence, cut at a word boundary to fit one terminal line."""
    text = " ".join(text.split())
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0].rstrip(",:;") + " ..."


def listing() -> dict[str, list[dict[str, str]]]:
    topologies = [{"name": t["name"], "gpus": f"{t['gpus']} x {t['gpu']}",
                   "description": _first_sentence(t["description"])}
                  for t in catalog.topologies()]
    workloads = [{"name": w["name"],
                  "recipe": f"{w['finetune']}, seq {w['seq_len']}, micro-batch "
                            f"{w['micro_batch']}, {w['precision']}",
                  "description": _first_sentence(w["description"])} for w in catalog.workloads()]
    return {"topologies": topologies, "workloads": workloads}


def run(args: argparse.Namespace) -> int:
    data = listing()
    if args.json:
        print(jsondoc.dumps(data))
        return 0
    print("Topologies (-t):")
    width = max(len(t["name"]) for t in data["topologies"])
    for t in data["topologies"]:
        print(f"  {t['name']:<{width}}  {t['gpus']:<18} {t['description']}")
    print("\nWorkloads (-w):")
    width = max(len(w["name"]) for w in data["workloads"])
    for w in data["workloads"]:
        print(f"  {w['name']:<{width}}  {w['recipe']:<44} {w['description']}")
    return 0
