"""`stepsim memory`: does the job fit on each GPU, and what takes the memory.

The first line is the verdict ("fits: needs X GiB of Y GiB per GPU" / "does not fit: ..."),
then one line per kind of memory on one GPU. ``--micro-batch max`` names the largest micro-batch
that fits; ``--largest-model`` scales the workload's model family (shape ratios kept) and names
the largest one that fits. ``--offload`` moves states to host RAM and adds its verdict; ``--pp``
gives each stage's memory, the verdict being the fullest stage's (the same as `run`'s).
``--json`` prints the same as one object.
"""

from __future__ import annotations

import argparse
from typing import Any

from simulator import api
from simulator.api import RunSpec
from simulator.commands import recipe_flags
from simulator.commands.parsing import NO_FIT_EXIT, machine_gpus, no_fit_status, whole
from simulator.errors import InputError
from simulator.inputs.schema import MAX_BATCH, MAX_BOXES, MAX_GPUS, MAX_TOKENS
from simulator.outputs import jsondoc
from simulator.units import GiB, positive_int


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "memory", help="memory per GPU of a training job and whether it fits",
        description="Itemise the memory one GPU needs for a training step (weights, gradients, "
                    "optimizer states, activations, buffers, reserve) and say whether it fits.")
    parser.add_argument("-t", "--topology", required=True,
                        help="topology YAML or preset name; NAME:K uses its first K GPUs")
    parser.add_argument("-w", "--workload", required=True,
                        help="workload YAML, preset name or hf:config.json")
    parser.add_argument("-s", "--strategy", default=None,
                        help=f"{' | '.join(api.STRATEGIES)} (default ddp), as `stepsim run` takes "
                        "them")
    parser.add_argument("--gpus", type=whole(1, MAX_GPUS), default=None,
                        help="use the first K GPUs (default: all GPUs of the machine)")
    parser.add_argument("--ep", type=whole(1, MAX_GPUS), default=1,
                        help="expert-parallel degree: a mixture of experts' experts over this "
                        "many ranks (with fsdp or zero3)")
    parser.add_argument("--nnodes", type=whole(1, MAX_BOXES), default=None,
                        help="boxes like the topology's (default its nnodes); --gpus counts "
                        "each box's")
    parser.add_argument("--tp", type=whole(1, MAX_GPUS), default=None,
                        help="tensor-parallel degree (tp, tp+ddp, tp+fsdp; default as run: "
                        "all GPUs for tp, 2 for the others)")
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="Megatron sequence parallelism with --tp (splits norm activations)")
    parser.add_argument("--micro-batch", default=None, metavar="B|max",
                        help="micro-batch per GPU (default: the workload's); 'max' searches the "
                             "largest micro-batch that fits")
    parser.add_argument("--seq-len", type=whole(1, MAX_TOKENS), default=None,
                        help="sequence length override")
    recipe_flags.add_training_arguments(parser)
    recipe_flags.add_config_arguments(parser)
    parser.add_argument("--offload", default=None, metavar="WHAT",
                        help="optimizer (zero1, zero2, zero3) or params (zero3, fsdp) in host "
                        "RAM: the GPU holds less, the host's memory is counted too")
    parser.add_argument("--pp", type=whole(1, MAX_GPUS), default=1,
                        help="pipeline stages: each stage holds its layers and the activations "
                        "its schedule keeps in flight (the verdict is the fullest stage's)")
    parser.add_argument("--schedule", default="1f1b", help="with --pp: gpipe | 1f1b | "
                        "interleaved")
    parser.add_argument("--virtual-stages", type=whole(1, MAX_GPUS), default=1,
                        help="model chunks per stage for --schedule interleaved")
    parser.add_argument("--grad-accum", type=whole(1, MAX_BATCH), default=None,
                        help="micro-batches per step (with --pp, how many are in flight)")
    parser.add_argument("--largest-model", action="store_true",
                        help="scale the workload's model (same shape ratios) and report the "
                             "largest that fits")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--fail-if-no-fit", action="store_true",
                        help=f"exit {NO_FIT_EXIT} (after the usual output) when the job does "
                        "not fit in GPU or host memory")
    parser.set_defaults(handler=run)


def spec_of(args: argparse.Namespace) -> RunSpec:
    """The RunSpec the flags describe: the same spec `stepsim run` would simulate."""
    micro_batch = None if args.micro_batch == "max" else positive_int(
        args.micro_batch, "--micro-batch", maximum=MAX_BATCH)
    files = recipe_flags.config_fields(args)
    if args.micro_batch == "max":  # searched: a DeepSpeed config's micro-batch does not apply
        files["explicit"] |= {"micro_batch"}
    topology, count = machine_gpus(args.topology)
    gpus = count or args.gpus
    spec = api.configured(RunSpec(
        topology, args.workload, api.check_strategy(args.strategy or "ddp"), gpus=gpus,
        nnodes=args.nnodes, tp=args.tp, ep=args.ep, micro_batch=micro_batch,
        seq_len=args.seq_len,
        sequence_parallel=args.sequence_parallel, grad_accum=args.grad_accum,
        offload=args.offload or "none", pp=args.pp, schedule=args.schedule,
        virtual_stages=args.virtual_stages, **recipe_flags.training_fields(args), **files))
    strategy = spec.strategy
    for message in dict(api.unused_flags(strategy, tp=args.tp, bucket_mb=None,
                                     overlap=True)).values():
        raise InputError(message)
    world = api.load_machine(topology, gpus, nnodes=args.nnodes).n_gpus
    api.check_recipe(strategy, tp=api.tp_degree(strategy, args.tp, world), overlap=True,
                     grad_compression="none", gradient_as_bucket_view=False,
                     sequence_parallel=args.sequence_parallel, reshard_after_forward=True,
                     zero_overlap_comm=None)
    return spec


def run(args: argparse.Namespace) -> int:
    result = api.memory(spec_of(args), largest_micro_batch=args.micro_batch == "max",
                        largest_model=args.largest_model)
    if args.json:
        print(jsondoc.dumps(result.summary))
    else:
        print(render(result.report, result.summary, list(result.hints)))
    return no_fit_status(args, result.summary)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:8.2f}"


def _parameters(r: api.MemoryReport, experts: dict[str, Any] | None) -> str:
    """The model's parameters; under --ep, the whole model's and what each rank holds."""
    if not experts or experts["ep"] == 1:
        return f"parameters {r.parameters:,} ({r.trainable_parameters:,} trainable"
    return (f"parameters {experts['model_parameters']:,}, {r.parameters:,} on each rank "
            f"({experts['routed'] // experts['ep']} of {experts['routed']} experts, --ep "
            f"{experts['ep']}; {r.trainable_parameters:,} trainable there")


def render(report: api.MemoryReport, out: dict[str, Any], hints: list[str]) -> str:
    r = report
    rows = [r.verdict(),
            f"{out['workload']} on {out['topology']} ({out['gpu']}): {out['strategy']}, {r.world} "
            f"GPU(s) = tp {r.tp} x dp {r.dp}"
            + (" (sharded in one box, replicated across the boxes)"
               if out["strategy"] == "hsdp" else "")
            + f"; micro-batch {r.micro_batch}, seq {r.seq_len}, "
            f"checkpointing {r.checkpointing}",
            f"recipe: {recipe_flags.training_words(out['recipe'])}",
            _parameters(r, out.get("experts"))
            + (f"; {out['experts']['active_parameters']:,} active per token: "
               f"{out['experts']['per_token']} of {out['experts']['routed']} experts"
               if "experts" in out else "")
            + f"); model states alone {r.model_state_bytes / GiB:.1f} GiB per GPU"
            + (" (more than the card holds)" if r.model_state_bytes > r.capacity_bytes else ""),
            "",
            f"{'per GPU':<12}{'GiB':>8}  what"]
    phase = r.peak_phase
    for line in r.lines:
        if r.holds(line, phase):
            rows.append(f"{line.category:<12}{_gib(line.bytes)}  {line.label}")
    rows.append(f"{'peak':<12}{_gib(r.peak_bytes)}  at the {api.MOMENTS[phase]}; capacity "
                f"{r.capacity_bytes / GiB:.1f} GiB")
    for other, words in api.MOMENTS.items():
        if other != phase:
            rows.append(f"{'':<12}{_gib(r.phase_total(other))}  at the {words}")
    basis = ("a replay of the allocator, with its spread on published peaks"
             if r.reserved_replayed else "the middle half of published runs' allocator overheads")
    spread = (f" ({r.reserved_range[0] / GiB:.2f}-{r.reserved_range[1] / GiB:.2f}: {basis})"
              if r.reserved_range else "")
    rows.append(f"{'counters':<12}{'':>8}  peak allocated {r.peak_as('allocated') / GiB:.2f} "
                f"GiB (torch.cuda.max_memory_allocated), reserved "
                f"{r.peak_as('reserved') / GiB:.2f} GiB{spread} (max_memory_reserved), device "
                f"total {r.peak_as('total') / GiB:.2f} GiB (with the CUDA context and NCCL)")
    idle = r.peak_as("total") - r.peak_bytes
    if idle > 0:  # cached blocks no request fits: freed before an out-of-memory error
        moment = max(api.MOMENTS, key=lambda m: r.counter_at("total", m))
        why = "; ".join(dict.fromkeys(x.label.removeprefix("allocator: ") for x in r.lines
                                      if x.pool == "idle" and api.alive(x, moment)))
        rows.append(f"{'':<12}{'':>8}  of which {idle / GiB:.2f} GiB idle in the allocator's cache "
                    f"(freed before it runs out of memory: not in the verdict): {why}")
    if r.setup:  # the set-up's allocator replayed (memory/fsdp_wrap.py)
        rows.append(f"{'set-up':<12}{'':>8}  after the FSDP wrap (sync_module_states): reserved "
                    f"{r.setup[0] / GiB:.2f} GiB (torch.cuda.memory_reserved), allocated "
                    f"{r.setup[1] / GiB:.2f} GiB: {(r.setup[0] - r.setup[1]) / GiB:.2f} GiB "
                    "cached before the first step")
    if r.reserved_streams:  # the replay's pools: a stream reuses only its own blocks
        named = {"default": "compute", "unshard": "FSDP's all-gathers",
                 "post_backward": "its reduce-scatters"}
        pools = ", ".join(f"{named.get(name, name)} {size / GiB:.2f} GiB"
                          for name, size in r.reserved_streams)
        rows.append(f"{'by stream':<12}{'':>8}  after the steps, each stream's own pool: {pools}")
    if r.paged_bytes:  # a paged optimizer: managed memory beside the verdict
        rows += ["", f"{'paged':<12}{'GiB':>8}  what (CUDA managed memory, outside the verdict)"]
        rows += [f"{line.category:<12}{_gib(line.bytes)}  {line.label}"
                 for line in r.lines if line.paged]
        rows.append(f"{'on the GPU':<12}{_gib(r.paged_resident_bytes)}  what the peak leaves "
                    "free")
        rows.append(f"{'to host':<12}{_gib(r.paged_to_host_bytes)}  paged out to host RAM")
    host = [line for line in r.lines if line.host]
    if host:  # offloaded: what each GPU's share puts in host RAM, and the machine's total
        rows += ["", f"{'host, per GPU':<12}{'GiB':>8}  what ({r.offload} offloaded)"]
        rows += [f"{line.category:<12}{_gib(line.bytes)}  {line.label}" for line in host]
        rows.append(f"{'host total':<12}{_gib(r.host_peak_bytes)}  {r.world} GPU(s); host RAM "
                    f"{r.host_capacity_bytes / GiB:,.1f} GiB")
    if "stages" in out:  # a pipeline: every stage's peak, the fullest first in the verdict
        rows += ["", "pipeline stages (GiB per GPU): " + ", ".join(
            f"{x['stage']}: {x['peak_bytes'] / GiB:.1f}" for x in out["stages"])
            + f"; the verdict is stage {out['stage']}'s"]
    rows += ["", *(f"note: {n}" for n in r.notes)]
    if "largest_micro_batch" in out:
        best = out["largest_micro_batch"]
        rows.append(f"largest micro-batch that fits: {best}" if best else
                    "largest micro-batch that fits: none (not even 1)")
    rows += [f"hint: {h}" for h in hints]
    if "largest_model" in out:
        m = out["largest_model"]
        if m is None:
            rows.append("largest model of this family that fits: none")
        else:
            rows.append(f"largest model of this family that fits: {m['parameters'] / 1e9:.2f}B "
                        f"parameters (layers {m['layers']}, hidden {m['hidden']}, heads "
                        f"{m['heads']}, kv heads {m['kv_heads']}, ffn {m['ffn_hidden']}; needs "
                        f"{m['peak_bytes'] / GiB:.1f} GiB)")
    return "\n".join(rows)
