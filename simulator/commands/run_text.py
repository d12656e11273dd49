"""How a run's report reads as text: the table of `stepsim run`, its rows (which `compare`
shares), the memory, host, offload, paging and pipeline lines, prices, and the notes under it
(buckets, the range, the confidence grade, a calibration, NCCL's variables).

A job that does not fit gets its verdict, its memory by kind and what would fit, not a table
of figures as if it ran; simulated anyway (``--simulate-anyway``), every figure says so.
"""

from __future__ import annotations

from typing import Any

from simulator.commands import recipe_flags, terminal
from simulator.outputs import figures as fig
from simulator.units import GiB


def memory_verdict(mem: dict[str, Any]) -> str:
    need, have = mem["peak_bytes"] / GiB, mem["capacity_bytes"] / GiB
    if mem["fits"]:
        return f"fits: needs {need:.1f} GiB of {have:.1f} GiB per GPU"
    return f"DOES NOT FIT: needs {need:.1f} GiB of {have:.1f} GiB per GPU"


def host_verdict(mem: dict[str, Any]) -> str | None:
    """The host-RAM verdict of an offloaded job (None when nothing lives there)."""
    need = mem.get("host_peak_bytes") or 0
    if not need:
        return None
    have = mem["host_capacity_bytes"]
    word = "fits" if mem["host_fits"] else "DOES NOT FIT"
    return f"{word}: needs {need / GiB:,.1f} GiB of the host's {have / GiB:,.1f} GiB"


def offload_summary(off: dict[str, Any]) -> str:
    return (f"{off['d2h_bytes_per_gpu'] / GiB:.2f} GiB down in {fig.seconds(off['d2h_s'])}, "
            f"{off['h2d_bytes_per_gpu'] / GiB:.2f} GiB up in {fig.seconds(off['h2d_s'])} per GPU "
            f"({'pinned' if off['pin_memory'] else 'pageable'}); CPU optimizer "
            f"{fig.seconds(off['cpu_optimizer_s'])}")


def paged_summary(mem: dict[str, Any], paging: dict[str, Any] | None) -> str:
    """A paged optimizer: where its states live, and what crosses the host link per step."""
    paged = mem["paged_optimizer"]
    text = (f"{paged['bytes'] / GiB:.1f} GiB of states: {paged['resident_bytes'] / GiB:.1f} "
            f"GiB on the GPU, {paged['paged_to_host_bytes'] / GiB:.1f} GiB in host RAM")
    if not paging:
        return text + "; nothing pages (they fit beside the rest)"
    return (text + f"; per step {paging['h2d_bytes_per_gpu'] / GiB:.2f} GiB in "
            f"({fig.seconds(paging['h2d_s'])}) and as much evicted "
            f"({fig.seconds(paging['d2h_s'])}), in line with compute")


def network_summary(net: dict[str, Any]) -> str:
    """Several boxes: how many, and how NCCL crosses between them."""
    how = "GPUDirect RDMA" if net["gpudirect_rdma"] else "staged through host memory"
    return f"{net['nnodes']} x {net['gpus_per_box']} GPUs, NET/{net['plugin']}, {how}"


def pipeline_summary(pipe: dict[str, Any]) -> str:
    chunks = f" x {pipe['virtual_stages']} chunks" if pipe["virtual_stages"] > 1 else ""
    return (f"{pipe['stages']} stages{chunks}, {pipe['schedule']}, {pipe['micro_batches']} "
            f"micro-batches: bubble {pipe['bubble_fraction']:.1%} of the pipeline phase "
            f"(closed form {pipe['bubble_fraction_closed_form']:.1%})")


# the rows of summary_rows that are figures of the simulated step (not verdicts or settings)
FIGURES = frozenset({"step time", "tokens/s", "tokens/s per GPU", "samples/s", "MFU", "compute",
                     "communication", "exposed communication", "scaling efficiency",
                     "offload", "paged optimizer", "pipeline", "bottleneck link",
                     "per GPU dollar", "price", "whole run", "buy or rent", "energy"})


def summary_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    step = r["step_time_s"]
    eff = r["scaling_efficiency"]
    bn = r["bottleneck"]
    exposed = r["exposed_comm_s"]
    rows = [
        ("step time", fig.seconds_ranged(step, r.get("step_time_s_range"))),
        ("tokens/s", fig.ranged(fig.count(r["tokens_per_s"]), r.get("tokens_per_s_range"),
                                fig.count)),
        ("tokens/s per GPU", fig.ranged(fig.count(r["tokens_per_s_per_gpu"]),
                                        r.get("tokens_per_s_per_gpu_range"), fig.count)),
        ("samples/s", fig.count(r["samples_per_s"])),
        ("MFU", fig.ranged(f"{r['mfu']:.1%}", r.get("mfu_range"), lambda x: f"{x:.1%}")
         + (f" of {r['flops_counted']['short']}" if r.get("flops_counted") else "")
         + (f"; HFU {r['hfu']:.1%} with recompute" if r.get("hfu", r["mfu"]) != r["mfu"]
            else "")),
        ("compute", fig.seconds(r["compute_time_s"])),
        ("communication", fig.seconds(r["comm_time_s"])),
        ("exposed communication",
         f"{fig.seconds_ranged(exposed, r.get('exposed_comm_s_range'))} "
         f"({exposed / step:.0%} of the step)" if step > 0 else "-"),
        *([("compute slowed by comm", interference_words(r["interference"]))]
          if r.get("interference", {}).get("transports") else []),
        ("scaling efficiency", "n/a (one GPU cannot hold it)" if eff is None else fig.ranged(
            f"{eff:.1%}", r.get("scaling_efficiency_range"), lambda x: f"{x:.1%}")
         + _above_one(eff, r)),
        ("memory per GPU", memory_verdict(r["memory"])),
        ("recipe", recipe_flags.training_words(r.get("recipe", {})) or "-"),
        *([("software", software_words(r["software"]))] if r.get("software") else []),
        *([("config files", recipe_flags.config_words(r["config_files"]))]
          if r.get("config_files") else []),
        *([("host memory", host)] if (host := host_verdict(r["memory"])) else []),
        *([("offload", offload_summary(r["offload"]))] if r.get("offload") else []),
        *([("paged optimizer", paged_summary(r["memory"], r.get("paging")))]
          if r["memory"].get("paged_optimizer") else []),
        *([("pipeline", pipeline_summary(r["pipeline"]))] if r.get("pipeline") else []),
        *([("boxes", network_summary(r["network"]))] if r.get("network") else []),
        ("bottleneck link", "none" if bn["link"] is None else
         f"{bn['link']} ({bn.get('description') or bn['link']}): "
         f"{bn['utilization']:.0%} of the step, "
         f"{bn['utilization_during_comm']:.0%} while communicating"),
    ]
    if r.get("gpus_price_usd"):
        rows.append(("per GPU dollar", f"{r['tokens_per_s_per_kusd']:,.0f} tokens/s per $1k "
                                       f"(GPUs ${r['gpus_price_usd']:,.0f})"))
    return rows + cost_rows(r)


def _above_one(eff: float | None, r: dict[str, Any]) -> str:
    """Why a run beats N times one GPU: expert parallelism shares out the per-expert work."""
    ep = r.get("parallelism", {}).get("ep", 1)
    if eff is None or eff <= 1 or ep <= 1:
        return ""
    return (f" (above 100%: each GPU runs 1/{ep} of the experts, so what each expert costs "
            "whatever its tokens (launches, QLoRA dequantization, small GEMMs) is shared; one "
            "GPU pays it for all)")


def interference_words(info: dict[str, Any]) -> str:
    """``0.51 ms (0.4% of compute) beside SHM collectives: SMs held, memory bandwidth``."""
    return (f"{fig.seconds(info['compute_slowed_s'])} ({info['share_of_compute']:.1%} of "
            f"compute) beside {'/'.join(info['transports'])} collectives: SMs their channels "
            "hold, memory bandwidth their kernels take")


def software_words(sw: dict[str, Any]) -> str:
    """``2023 (PyTorch 2.0, CUDA 11.8): GEMM row hopper CUDA 11.8 (cuBLAS 11.11), 90% of
    today's; attention triton``."""
    stack, gemm = sw["stack"], sw["gemm"]
    name = "today's stack" if stack["given"] == "today" else stack["given"]
    where = f"{gemm['arch']} {gemm['row']}" if "arch" in gemm else gemm["row"]
    cuda_cores = gemm.get("bf16_on_cuda_cores")
    bf16 = (f"; bf16 GEMMs emulated on the CUDA cores at {cuda_cores:.0%} of the fp16 tensor "
            "rate (no bf16 tensor cores before sm80)" if cuda_cores else "")
    att = sw["attention"]
    why = f" ({att['why']})" if att and "why" in att else ""
    attention = f"; attention kernel {att['kernel']}{why}" if att else ""
    return (f"{name} (PyTorch {stack['torch']}, CUDA {stack['cuda']}): GEMM row {where}, "
            f"{gemm['share']:.0%} of today's rate{attention}" + bf16)


def _usd(value: float) -> str:
    return f"${value:.3g}" if value < 1000 else f"${value:,.0f}"


def cost_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Price, whole-run, buy-versus-rent and energy rows (where the report has them)."""
    rows: list[tuple[str, str]] = []
    cost, basis = r.get("cost") or {}, r.get("cost_basis") or {}
    if cost.get("usd_per_hour") is not None:
        per_million = fig.ranged(_usd(cost["usd_per_million_tokens"]),
                                 cost.get("usd_per_million_tokens_range"), _usd)
        rows.append(("price", f"{per_million} per million tokens "
                              f"(${cost['usd_per_hour']:,.2f}/h: {basis['usd_per_hour_source']})"))
    if cost.get("time_to_train_s") is not None:
        took = fig.ranged(fig.duration(cost["time_to_train_s"]), cost.get("time_to_train_s_range"),
                          fig.duration)
        money = ("" if cost["usd_to_train"] is None else
                 ", " + fig.ranged(_usd(cost["usd_to_train"]), cost.get("usd_to_train_range"),
                                   _usd))
        rows.append(("whole run", f"{cost['train_tokens']:,} tokens in {took}{money}"))
    if cost.get("breakeven_months") is not None:
        rows.append(("buy or rent", f"buying (${basis['purchase_usd']:,.0f}) pays off after "
                                    f"{cost['breakeven_months']:.3g} months at "
                                    f"{basis['utilization']:.0%} use and "
                                    f"${basis['usd_per_kwh']:g}/kWh"))
    power = r.get("energy") or {}
    if power.get("joules_per_step") is not None:
        per_token = power["kwh_per_million_tokens"]
        rows.append(("energy", f"{power['joules_per_step']:,.0f} J per step, "
                               f"{power['avg_power_w'] / 1000:.3g} kW average"
                               + ("" if per_token is None else
                                  f", {per_token:.3g} kWh per million tokens")))
    return rows


def bucket_summary(buckets: list[dict[str, Any]]) -> str:
    if not buckets:
        return ""
    sizes = [b["bytes"] for b in buckets]
    first, last = buckets[0], buckets[-1]
    return (f"{len(buckets)} buckets, {sum(sizes) / 2**20:,.1f} MiB of gradients "
            f"(largest {max(sizes) / 2**20:.1f} MiB, smallest {min(sizes) / 2**20:.2f} MiB); "
            f"first all-reduce starts at {fig.seconds(first['start_s'])}, last ends at "
            f"{fig.seconds(last['end_s'])}")


def figures_title(r: dict[str, Any]) -> str:
    cards = " + ".join(f"{len(ranks)} x {name}" for name, ranks in
                       r.get("cards", {r["gpu"]: range(r["gpus"])}).items())
    ep = r.get("parallelism", {}).get("ep", 1)
    return (f"{r['workload']} on {r['topology']} ({cards}), {r['strategy']}"
            f"{f', experts over {ep} GPUs (--ep {ep})' if ep > 1 else ''}"
            f"{'' if r.get('overlap', True) else ', no overlap'}"
            + "".join(f", {x}" for x in recipe_flags.words(r.get("recipe", {}))))


AS_IF = " (as if it fit)"  # beside every figure of a job simulated anyway


def not_fit_lines(r: dict[str, Any], would_fit: list[dict[str, Any]]) -> list[str]:
    """A job that does not fit: its verdict, its memory by kind, what would fit."""
    mem = r["memory"]
    lines = [f"{figures_title(r)}: {memory_verdict(mem)}"]
    host = host_verdict(mem)
    if host and not mem.get("host_fits", True):
        lines[0] += f"; host memory {host}"
    parts = mem.get("breakdown_bytes") or {}
    lines.append("  per GPU: " + ", ".join(f"{k} {v / GiB:.1f} GiB" for k, v in parts.items()
                                           if v))
    lines.append("  not simulated: a step that runs out of memory has no step time, "
                 "throughput or price (--simulate-anyway gives them as if it fit)")
    if would_fit:
        lines.append("  what would fit:")
        lines += [f"    {w['flags'] or w['change']}: {w['detail']}"
                  + (f" ({w['change']})" if w["flags"] else "") for w in would_fit]
    return lines


def print_text(r: dict[str, Any], out: Any = None,
               would_fit: list[dict[str, Any]] | None = None) -> None:
    console = terminal.console(out)
    if r.get("simulated") is False:
        for line in not_fit_lines(r, would_fit or []):
            console.print(line)
        return
    anyway = bool(r.get("simulated_anyway"))
    if anyway:
        console.print(f"memory: {memory_verdict(r['memory'])}; simulated anyway: every figure "
                      "below is what the step would take if it fit")
    if not r["memory"].get("host_fits", True):
        console.print(f"host memory: {host_verdict(r['memory'])}; the offloaded states would "
                      "not fit in host RAM")
    title = figures_title(r) + (" - DOES NOT FIT, simulated anyway" if anyway else "")
    table = terminal.table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in summary_rows(r):
        table.add_row(name, value + (AS_IF if anyway and name in FIGURES else ""))
    terminal.show(table, console)
    if r.get("buckets"):
        console.print("buckets: " + bucket_summary(r["buckets"]))
    if r.get("range_basis"):
        console.print(r["range_basis"]["summary"])
    if r.get("confidence"):
        console.print(r["confidence"]["summary"])
    if anyway and would_fit:
        console.print("what would fit: " + "; ".join(
            f"{w['flags'] or w['change']} ({w['detail']})" for w in would_fit))
    cal = r.get("calibration")
    if cal:
        console.print(f"calibrated machine ({cal['source'] or 'stepsim calibrate'}): "
                      + (", ".join(f"{k} {v:.3g}" for k, v in cal["fitted"].items())
                         or "no collective parameter fitted"))
        if cal["compute_achieved_fraction"]:
            console.print("  compute from a measured step of this job: " + ", ".join(
                f"{gpu} at {f:.0%} of the modelled speed"
                for gpu, f in cal["compute_achieved_fraction"].items()))
        elif cal["compute_calibrated_for_other_workloads"]:
            console.print("  compute is modelled: the measured step was of "
                          + ", ".join(cal["compute_calibrated_for_other_workloads"]))
    env = r.get("nccl_env")
    if env:
        console.print("NCCL environment (read as NCCL reads it): " + " ".join(
            f"{k}={v}" for k, v in env["variables"].items()))
        for line in [f"{x}: ignored, as NCCL ignores it" for x in env["ignored"]] + (
                env["effects"] or ["it changes nothing on this machine"]):
            console.print(f"  {line}")
