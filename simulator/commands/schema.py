"""`stepsim schema topology|workload`: the JSON Schema of a YAML input, as pydantic checks it.

Editors validate and complete YAML with it (the YAML language server reads a
``# yaml-language-server: $schema=FILE`` comment at the top of the file).
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schema", help="the JSON Schema of topology or workload YAML (for editors)",
        description="Print the JSON Schema of a topology or workload file, made from the "
        "models stepsim validates with; save it and point your editor at it "
        "(`# yaml-language-server: $schema=workload.schema.json`).")
    parser.add_argument("kind", choices=("topology", "workload"), help="which input")
    parser.set_defaults(handler=run)


def document(kind: str) -> dict[str, Any]:
    from simulator.inputs.schema import TopologyConfig, WorkloadConfig, json_schema

    model = TopologyConfig if kind == "topology" else WorkloadConfig
    schema = json_schema(model)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"stepsim {kind}", **{k: v for k, v in schema.items() if k != "title"}}


def run(args: argparse.Namespace) -> int:
    print(json.dumps(document(args.kind), indent=2))
    return 0
