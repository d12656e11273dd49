"""`stepsim advise`: which strategy, recipe and micro-batch to run a job with, on each machine.

``-t`` repeats (one machine each, each with its own ``--price-per-gpu-hour`` if given once per
machine); ``--nnodes 1,2,4`` weighs each at those box counts (advice/boxes.py: a second
box?). Prints the explanation lines (the winner and its bottleneck, what does not fit, the
runner-up and its cost, what would fit when nothing does), or with ``--json`` the whole
answer: ``{candidates, best, nothing_fits, what_would_fit, explanation}``; ``--csv`` a row per
ranked candidate (``rank`` first). ``--what-if`` adds
the upgrades a buyer can choose for the winner (simulator/advice/whatif.py), and with several
box counts the fewest boxes' upgrades too: add a box, or upgrade the one you have? The work is in
simulator/advice/advise.py.
"""

from __future__ import annotations

import argparse
from typing import Any

from simulator import api
from simulator.advice import advise as core
from simulator.advice import explain, spec_text, whatif
from simulator.commands import html_flag, price_flags, recipe_flags, script_output, terminal
from simulator.commands.parsing import Each, machine_gpus
from simulator.inputs.schema import MAX_BOXES
from simulator.units import positive_int


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "advise", help="the best strategy, recipe and micro-batch for a job on each machine",
        description="Enumerate DDP, ZeRO-1/2/3, FSDP, tensor parallelism, pipelines, "
        "offload and their combinations with every checkpointing mode, torch.compile where "
        "the framework has it, and the micro-batches, gradient accumulation, DDP bucket sizes "
        "and DeepSpeed switches that fit; simulate those that could win (pruned by memory, "
        "then by a compute bound) and rank them, e.g. "
        "`stepsim advise -t 8x5090-dual-socket -w llama2-7b`.")
    parser.add_argument("-t", "--topology", required=True, action=Each,
                        help="topology YAML or preset name (repeatable, or a comma list); "
                        "NAME:K uses its first K GPUs")
    parser.add_argument("-w", "--workload", required=True,
                        help="workload YAML, preset name or hf:config.json")
    parser.add_argument("--nnodes", default=None, metavar="N[,N...]",
                        help="box counts to weigh each topology at, e.g. 1,2,4 (a second box, "
                        "or not?); default the topology's nnodes")
    parser.add_argument("--objective", default="throughput", metavar="GOAL",
                        help=f"what to rank by: {' | '.join(core.OBJECTIVES)} "
                        "(default throughput)")
    recipe_flags.add_adapter_arguments(parser)
    parser.add_argument("--padded", action="store_true",
                        help="the batches are padded and carry their attention mask "
                        "(training.padded): sdpa runs its memory-efficient kernel, and the "
                        "answer says what flash-attn 2 would buy")
    price_flags.add_arguments(parser)
    parser.add_argument("--jobs", default=None, metavar="N",
                        help="worker processes (default: one per CPU core)")
    parser.add_argument("--what-if", action="store_true",
                        help="add the upgrades a buyer can choose for the winner: P2P driver, "
                        "PCIe switch or two sockets, next PCIe generation, NVLink bridge, "
                        "twice the GPUs, a card with more memory")
    html_flag.add_argument(parser)
    script_output.add_arguments(parser, row="candidate")
    parser.set_defaults(handler=run)


def _fewest_boxes_best(answer: dict[str, Any], machines: list[core.PricedMachine]
                       ) -> dict[str, Any] | None:
    """With several box counts weighed: the best candidate on the fewest boxes (None: one
    count only, or nothing fits there)."""
    counts = {m.nnodes for m in machines}
    if len(counts) < 2:
        return None
    fewest = min(c or 1 for c in counts)
    return next((c for c in answer["candidates"]
                 if c["parallelism"].get("nnodes", 1) == fewest), None)


def machines_of(args: argparse.Namespace) -> list[core.PricedMachine]:
    """Each -t (NAME or NAME:K) at each --nnodes count."""
    counts: list[int | None] = [None]
    if args.nnodes is not None:
        counts = [positive_int(v.strip(), "--nnodes", maximum=MAX_BOXES)
                  for v in str(args.nnodes).split(",")]
    out = []
    for i, text in enumerate(args.topology):
        topology, gpus = machine_gpus(text)
        prices = price_flags.prices(args, i, len(args.topology))
        out += [core.PricedMachine(topology, prices, gpus, n) for n in dict.fromkeys(counts)]
    return out


def _machine_of(machines: list[core.PricedMachine], report: dict[str, Any]
                ) -> core.PricedMachine:
    o = report["options"]
    return next(m for m in machines if m.key == (o["topology"], o["gpus"], o.get("nnodes")))


def answer_of(args: argparse.Namespace, *, progress: Any = None,
              executor: Any = None) -> dict[str, Any]:
    """advise's whole answer for the flags (with --what-if's upgrades): what every output of
    `advise` shows."""
    machines = machines_of(args)
    jobs = positive_int(args.jobs, "--jobs")
    answer = core.advise(machines, args.workload, objective=args.objective, jobs=jobs,
                         progress=progress, peft=args.peft, load_in_4bit=args.load_in_4bit,
                         padded=args.padded,
                         executor=executor)
    if args.what_if and answer["best"] is not None:
        best = answer["best"]
        best["what_if"] = whatif.upgrades(best, _machine_of(machines, best).prices)
        answer["explanation"] += whatif.lines(best, best["what_if"])
        first = _fewest_boxes_best(answer, machines)
        if first is not None and first is not best:  # or upgrade the box there is?
            first["what_if"] = whatif.upgrades(first, _machine_of(machines, first).prices)
            answer["explanation"] += ["or upgrade the box instead of adding one:",
                                      *whatif.lines(first, first["what_if"])]
    return answer


def finalists(answer: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The pick, the runner-up and the best candidate without the pick's thin mechanisms,
    each with its step's lanes: what the HTML report draws."""
    picked = [("pick", answer["best"])]
    if answer.get("without_thin_mechanisms"):
        picked.append(("without its thin mechanisms", answer["without_thin_mechanisms"]))
    seen = {id(r) for _, r in picked}
    for r in answer["candidates"][1:]:
        if len(picked) >= 3 or id(r) in seen:
            break
        picked.append((f"candidate {answer['candidates'].index(r) + 1}", r))
    labels, reports = [], []
    for word, r in picked:
        if r is None:
            continue
        drawn = api.answer(spec_text.spec_of(r["options"]), baseline=False, gantt=True)
        labels.append(f"{word}: {r['label']} on {explain.machine_of(r)}")
        reports.append({**r, "gantt": drawn.get("gantt")})
    return labels, reports


def run(args: argparse.Namespace) -> int:
    script_output.check(args)
    html_flag.check(args)
    with terminal.progress("simulating candidates") as update:
        answer = answer_of(args, progress=update)
    if args.html:
        labels, reports = finalists(answer) if answer["best"] is not None else ([], [])
        html_flag.write(args, labels, reports, answer["explanation"], doc=answer)
    if args.json:
        script_output.print_json(answer)
    elif args.csv:  # the ranked candidates, best first
        script_output.print_csv(({"rank": i, **c} for i, c in
                                 enumerate(answer["candidates"], 1)), first=["rank"])
    else:
        print("\n".join(answer["explanation"]))
    return script_output.status(args, (c["memory"] for c in answer["candidates"]))
