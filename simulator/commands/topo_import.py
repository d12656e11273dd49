"""`stepsim topo import FILE`: a topology YAML from `nvidia-smi topo -m` or NCCL's topology XML.

The file's kind is told from its first character (``<``: NCCL's XML, else the matrix). The
result is checked by building the machine before anything is written; ``-o`` writes it all or
nothing, without ``-o`` the YAML goes to stdout. The assumptions it made are in the YAML's
header comment and, with ``-o``, printed; what it recovered from an incomplete paste (a missing
row, abbreviated columns) is one warning line each on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from simulator import api
from simulator.errors import InputError, quoted
from simulator.inputs import choices, nccl_topo_xml, nvidia_smi, topo_import
from simulator.inputs.schema import TopologyConfig
from simulator.outputs.files import write_atomically


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "import", help="a topology YAML from `nvidia-smi topo -m` or NCCL_TOPO_DUMP_FILE XML",
        description="Write a topology YAML (the explicit form) from the output of "
                    "`nvidia-smi topo -m` or from NCCL's topology XML (NCCL_TOPO_DUMP_FILE).")
    parser.add_argument("file", metavar="FILE", help="the saved matrix or XML")
    parser.add_argument("--gpu", metavar="NAME|FIRST-LAST=NAME,...",
                        help="the card of every GPU, or by GPU index for a box of several "
                             "(0-3=rtx4090,4-7=rtx3090); default: the models the file names "
                             "(nvidia-smi -L lines). Catalog: "
                             f"{', '.join(choices.GPU_NAMES)}")
    parser.add_argument("-o", "--output", metavar="OUT.yaml", help="write here (default: stdout)")
    parser.add_argument("--name", help="the machine's name (default: the file's stem)")
    parser.add_argument("--pcie-gen", type=int, choices=choices.PCIE_GENERATIONS,
                        help="PCIe generation of every link (default: the GPU's)")
    parser.add_argument("--lanes", type=int, help="PCIe lanes of every link (default 16)")
    parser.add_argument("--p2p", choices=("on", "off"),
                        help="PCIe peer-to-peer (default: from `topo -p2p` if pasted, else off "
                             "for GeForce, on otherwise)")
    parser.add_argument("--cpu", metavar="FAMILY",
                        help=f"CPU family ({', '.join(choices.CPU_FAMILIES)}; or a socket link: "
                             f"{', '.join(choices.SOCKET_LINKS)}); default: NCCL's XML "
                             f"CPUID, else {choices.DEFAULT_CPU}, said in the YAML")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read the file: {exc.strerror or exc}",
                         file=args.file) from None
    if args.lanes is not None and args.lanes not in (1, 2, 4, 8, 16):
        raise InputError(f"--lanes {args.lanes}: expected 1, 2, 4, 8 or 16")
    known = {*choices.CPU_FAMILIES, *choices.SOCKET_LINKS}
    if args.cpu is not None and args.cpu not in known:
        raise InputError(f"--cpu {quoted(args.cpu)}: known: {', '.join(choices.CPU_FAMILIES)} "
                         f"(or a socket link: {', '.join(choices.SOCKET_LINKS)})")
    if args.gpu is not None and "=" not in args.gpu:
        choices.check_gpu(args.gpu)  # an unknown name is an error before the file is read
    opts = topo_import.ImportOptions(
        gpu=args.gpu, name=args.name or path.stem.split(".")[0], pcie_gen=args.pcie_gen,
        lanes=args.lanes, p2p=None if args.p2p is None else args.p2p == "on",
        cpu_model=args.cpu)
    if text.lstrip().startswith("<"):
        imported = topo_import.from_nccl_xml(nccl_topo_xml.parse(text, str(path)), opts,
                                             path.name)
    else:
        imported = topo_import.from_matrix(nvidia_smi.parse(text, str(path)), opts, path.name)
    machine = api.Machine.from_config(TopologyConfig.from_data(imported.data))
    yaml_text = imported.to_yaml()
    for line in imported.warnings:
        print(f"{path}: warning: {line}", file=sys.stderr)
    if args.output is None:
        print(yaml_text, end="")
        return 0
    write_atomically(args.output, lambda tmp: tmp.write_text(yaml_text, encoding="utf-8"),
                     announce=False)  # the line below names the file and what is in it
    models = ", ".join(f"{len(ranks)} x {card.name}" for card, ranks in machine.cards().items())
    print(f"wrote {args.output}: {models}, "
          f"{sum(1 for n in machine.config.nodes if n.kind == 'cpu')} socket(s), "
          f"{sum(1 for n in machine.config.nodes if n.kind == 'pcie_switch')} PCIe switch(es)")
    for line in imported.assumptions:
        print(f"  assumed: {line}")
    return 0
