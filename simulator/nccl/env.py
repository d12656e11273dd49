"""NCCL's environment variables, read as NCCL reads them, and what they change on a machine.

- ``NCCL_P2P_DISABLE``: ``strtol(value, 0, 0) == 1`` disables P2P (level LOC); any other value
  does nothing (src/graph/paths.cc ncclGetLevel).
- ``NCCL_P2P_LEVEL``: a path type name, compared case-sensitively (``strcmp`` against LOC, NVL,
  NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS), or an old-style number 0-5 (LOC, PIX, PXB, PHB, SYS,
  SYS); anything else is ignored. NCCL_P2P_DISABLE=1 wins over it.
- ``NCCL_SHM_DISABLE``: an integer parameter (``strtoll(value, 0, 0)``, src/misc/param.cc);
  1 disables SHM, so pairs without P2P fall back to the NET transport, sockets over loopback
  (src/transport/shm.cc), as in a container without ``--ipc=host``.
- ``NCCL_ALGO`` / ``NCCL_PROTO``: NCCL's list syntax (src/graph/tuning.cc parseList):
  ``ring,tree``, ``^LL128`` (all but), ``allreduce:tree;broadcast:ring`` (per function),
  names case-insensitive; an unknown name is an error, as in NCCL (ncclInvalidUsage).
  Explicitly enabling LL128 enables it even where NCCL's default leaves it off (PCIe).
- ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS``: clamp the communicator's channels after
  connect.cc's doubling (min at most 64, max at least 1; NCCL_MIN/MAX_NRINGS are the old names).
- ``NCCL_NTHREADS``: threads per channel of the Simple and LL kernels (tuning.cc getNthreads: a
  positive value not a multiple of 32 or above the protocol's maximum reads as the maximum, one
  below 64 as 64; 0 or less leaves NCCL's default).
- Point-to-point integer parameters (``NCCL_PARAM``, strtoll; nccl/alltoall.py applies them):
  ``NCCL_P2P_NET_CHUNKSIZE`` / ``NCCL_P2P_PCI_CHUNKSIZE`` / ``NCCL_P2P_NVL_CHUNKSIZE`` (init.cc
  L818-820), ``NCCL_BUFFSIZE`` (init.cc L813: the P2P chunk is at most an eighth of it),
  ``NCCL_NCHANNELS_PER_NET_PEER`` (paths.cc ncclTopoGetNchannels), ``NCCL_MIN_P2P_NCHANNELS`` /
  ``NCCL_MAX_P2P_NCHANNELS`` (paths.cc L946-947), ``NCCL_P2P_LL_THRESHOLD`` (enqueue.cc L859),
  ``NCCL_P2P_READ_ENABLE`` (p2p.cc L327).

Between boxes (nccl/net.py):

- ``NCCL_NET``: the network plugin by name, compared case-insensitively (``strcasecmp``,
  src/plugin/net.cc ncclNetInit): ``IB`` (verbs: InfiniBand or RoCE) or ``Socket``; unset, NCCL
  tries IB first and falls back to sockets.
- ``NCCL_IB_DISABLE``: an integer parameter; any value but 0 disables the IB plugin
  (src/transport/net_ib/init.cc ``if (ncclParamIbDisable()) return ncclInternalError``).
- ``NCCL_NET_GDR_LEVEL``: GPUDirect RDMA only where the GPU-NIC path type is at most this (path
  names or old numbers, as NCCL_P2P_LEVEL; src/graph/paths.cc ncclTopoCheckGdr, default PXB).
- ``NCCL_NET_GDR_READ``: 0 keeps sends staged through host memory; 1 lets them read GPU memory
  even before Ampere; default -2 (paths.cc).
- ``NCCL_CROSS_NIC``: 0 keeps a ring on one NIC rail, 1 lets it leave by another NIC, 2 (the
  default) lets rings alternate (src/graph/search.cc).
- ``NCCL_SOCKET_NTHREADS`` / ``NCCL_NSOCKS_PERTHREAD``: helper threads and sockets per thread of
  the socket transport; default -2: none on a plain NIC, the proxy thread alone moving data on
  one socket (src/transport/net_socket.cc ncclNetSocketGetNsockNthread; 2 x 8 on AWS, 4 x 1 on
  GCP); threads at most 16, sockets at most 64 in all.

Only the environment is read (not /etc/nccl.conf or ~/.nccl.conf).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError, cut, quoted

# integer parameters of the point-to-point path, read as NCCL_PARAM reads them
P2P_PARAMETERS = ("NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE", "NCCL_P2P_NVL_CHUNKSIZE",
                  "NCCL_BUFFSIZE", "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_MIN_P2P_NCHANNELS",
                  "NCCL_MAX_P2P_NCHANNELS", "NCCL_P2P_LL_THRESHOLD", "NCCL_P2P_READ_ENABLE")
VARIABLES = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_ALGO",
             "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS",
             *P2P_PARAMETERS, "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL",
             "NCCL_NET_GDR_READ", "NCCL_CROSS_NIC", "NCCL_SOCKET_NTHREADS",
             "NCCL_NSOCKS_PERTHREAD")
NETS = ("IB", "Socket")  # the internal network plugins, in the order NCCL tries them
MAX_SOCKET_THREADS, MAX_SOCKETS = 16, 64  # net_socket.cc MAX_THREADS, MAX_SOCKETS
# topo.cc topoPathTypeStr up to PATH_SYS; paths.cc levelsOldToNew
PATH_NAMES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")
# init.cc ncclFuncStr, ncclAlgoStr, ncclProtoStr
FUNCTIONS = {"broadcast": "broadcast", "reduce": "reduce", "allgather": "allgather",
             "reducescatter": "reducescatter", "allreduce": "allreduce"}
ALGORITHMS = ("tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
MODELLED_ALGORITHMS = ("ring", "tree")
PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
MAX_CHANNELS = 64  # device.h MAXCHANNELS
WARP_SIZE, MIN_THREADS = 32, 64  # device.h WARP_SIZE; tuning.cc getNthreads' minimum 2 warps


def strtoll(text: str) -> int:
    """C's strtoll(text, NULL, 0): leading space, sign, 0x hex / 0 octal / decimal; the digits
    it can read, 0 if none."""
    match = re.match(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", text)
    if not match:
        return 0
    sign, digits = match.groups()
    value = int(digits, 16) if digits[:2].lower() == "0x" else int(digits, 8 if
                                                                   digits[0] == "0" else 10)
    return -value if sign == "-" else value


@dataclass(frozen=True)
class NcclEnv:
    """What NCCL's variables say, already parsed; the default changes nothing."""

    settings: tuple[tuple[str, str], ...] = ()  # (variable, value) as given, in VARIABLES order
    p2p_level: str | None = None  # LOC from NCCL_P2P_DISABLE=1, or NCCL_P2P_LEVEL's type
    shm_disable: bool = False
    algorithms: tuple[tuple[str, tuple[str, ...]], ...] = ()  # op -> enabled (NCCL_ALGO)
    protocols: tuple[tuple[str, tuple[str, ...]], ...] = ()  # op -> enabled (NCCL_PROTO)
    min_channels: int | None = None
    max_channels: int | None = None
    nthreads: int | None = None  # NCCL_NTHREADS when positive
    p2p: tuple[tuple[str, int], ...] = ()  # P2P_PARAMETERS given, as integers
    ignored: tuple[str, ...] = field(default=(), compare=False)  # values NCCL would ignore
    # between boxes (nccl/net.py): None is NCCL's default
    net: str | None = None  # NCCL_NET: "IB" | "Socket"
    ib_disable: bool = False
    gdr_level: str | None = None  # NCCL_NET_GDR_LEVEL's path type
    gdr_read: int | None = None
    cross_nic: int | None = None
    socket_threads: int | None = None
    socks_per_thread: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> NcclEnv:
        given = tuple((name, environ[name]) for name in VARIABLES if name in environ)
        values = dict(given)
        ignored: list[str] = []
        level = _p2p_level(values, ignored)
        shm = "NCCL_SHM_DISABLE" in values and strtoll(values["NCCL_SHM_DISABLE"]) == 1
        algos = _lists(values.get("NCCL_ALGO"), "NCCL_ALGO", ALGORITHMS)
        protos = _lists(values.get("NCCL_PROTO"), "NCCL_PROTO", tuple(PROTOCOLS))
        low = _channels(values, "NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS", environ)
        high = _channels(values, "NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", environ)
        threads = strtoll(values["NCCL_NTHREADS"]) if "NCCL_NTHREADS" in values else None
        p2p = tuple((name, strtoll(values[name])) for name in P2P_PARAMETERS
                    if values.get(name, "").strip())
        network = _network(values, ignored)
        return cls(given, level, shm, algos, protos,
                   None if low is None else min(max(low, 0), MAX_CHANNELS) or None,
                   None if high is None else min(max(high, 1), MAX_CHANNELS),
                   threads if threads is not None and threads > 0 else None, p2p,
                   tuple(ignored), **network)

    @property
    def active(self) -> bool:
        return bool(self.settings)

    def enabled_algorithms(self, op: str) -> tuple[str, ...] | None:
        """The modelled algorithms NCCL_ALGO leaves for ``op`` (None: not set)."""
        table = dict(self.algorithms)
        if op not in table:
            return None
        return tuple(a for a in MODELLED_ALGORITHMS if a in table[op])

    def enabled_protocols(self, op: str) -> tuple[str, ...] | None:
        table = dict(self.protocols)
        if op not in table:
            return None
        return tuple(PROTOCOLS[p] for p in PROTOCOLS if p in table[op])

    def ll128_forced(self, op: str) -> bool:
        """NCCL_PROTO names LL128 for this op: enabled even off NVLink (tuning.cc pEnable 1)."""
        return "LL128" in (self.enabled_protocols(op) or ())

    def channels(self, comm_channels: int) -> int:
        """connect.cc: min(NCCL_MAX_NCHANNELS, channels), then at least NCCL_MIN_NCHANNELS."""
        n = comm_channels if self.max_channels is None else min(self.max_channels,
                                                                comm_channels)
        return n if self.min_channels is None else max(self.min_channels, n)

    def threads(self, default: int, maximum: int) -> int:
        """tuning.cc getNthreads: NCCL_NTHREADS where set and valid, else ``default``."""
        nt = self.nthreads
        if nt is None:
            return default
        if nt % WARP_SIZE or nt > maximum:
            return maximum
        return max(nt, MIN_THREADS)

    def param(self, name: str, default: int) -> int:
        """A point-to-point integer parameter (P2P_PARAMETERS), else NCCL's default."""
        return dict(self.p2p).get(name, default)

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.settings)


NO_ENV = NcclEnv()  # no NCCL_* variable set


def _network(values: dict[str, str], ignored: list[str]) -> dict[str, Any]:
    """The network variables as NCCL reads them (module docstring)."""
    out: dict[str, Any] = {}
    if "NCCL_NET" in values:
        name = values["NCCL_NET"]
        match = [n for n in NETS if n.lower() == name.strip().lower()]
        if not match:  # NCCL: "Failed to initialize any NET plugin"
            raise InputError(f"NCCL_NET={cut(name)}: NCCL has no network plugin of that name; "
                             f"its own are {' and '.join(NETS)}")
        out["net"] = match[0]
    if "NCCL_IB_DISABLE" in values:
        out["ib_disable"] = strtoll(values["NCCL_IB_DISABLE"]) != 0
    if "NCCL_NET_GDR_LEVEL" in values:
        text = values["NCCL_NET_GDR_LEVEL"]
        if text in PATH_NAMES:
            out["gdr_level"] = text
        elif text[:1].isdigit():
            out["gdr_level"] = OLD_LEVELS[min(strtoll(text), len(OLD_LEVELS) - 1)]
        else:
            ignored.append(f"NCCL_NET_GDR_LEVEL={text} (NCCL compares level names "
                           f"case-sensitively: {', '.join(PATH_NAMES)})")
    for name, key in (("NCCL_NET_GDR_READ", "gdr_read"), ("NCCL_CROSS_NIC", "cross_nic"),
                      ("NCCL_SOCKET_NTHREADS", "socket_threads"),
                      ("NCCL_NSOCKS_PERTHREAD", "socks_per_thread")):
        if values.get(name, "").strip():
            out[key] = strtoll(values[name])
    return out


def _p2p_level(values: dict[str, str], ignored: list[str]) -> str | None:
    if "NCCL_P2P_DISABLE" in values:
        if strtoll(values["NCCL_P2P_DISABLE"]) == 1:
            return "LOC"
        ignored.append(f"NCCL_P2P_DISABLE={values['NCCL_P2P_DISABLE']} (only 1 disables P2P)")
    text = values.get("NCCL_P2P_LEVEL")
    if text is None:
        return None
    if text in PATH_NAMES:
        return text
    if text[:1].isdigit():
        return OLD_LEVELS[min(strtoll(text), len(OLD_LEVELS) - 1)]
    ignored.append(f"NCCL_P2P_LEVEL={text} (NCCL compares level names case-sensitively: "
                   f"{', '.join(PATH_NAMES)})")
    return None


def _lists(text: str | None, name: str,
           elements: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """tuning.cc parseList: 'a,b' | '^a' | 'func:a,b;func:^c' into op -> enabled elements."""
    if text is None:
        return ()
    enabled = {f: set(elements) for f in FUNCTIONS}
    for k, token in enumerate(text.split(";")):
        prefix, sep, items = token.rpartition(":")
        if not sep:
            if k:
                raise InputError(f"{name}={cut(text)}: all entries except the first must have a "
                                 "prefix (function:)")
            funcs = list(FUNCTIONS)
        else:
            funcs = [f for f in FUNCTIONS if f == prefix.strip().lower()]
            if not funcs:
                raise InputError(f"{name}={cut(text)}: unrecognized function "
                                 f"{quoted(prefix)}; NCCL knows {', '.join(FUNCTIONS)}")
        negate = items.startswith("^")
        names = {e.strip().lower() for e in items.lstrip("^").split(",") if e.strip()}
        unknown = sorted(names - set(elements))
        if unknown:
            raise InputError(f"{name}={cut(text)}: unrecognized element {quoted(unknown[0])}; "
                             f"NCCL knows {', '.join(elements)}")
        for f in funcs:
            enabled[f] = set(elements) - names if negate else names
    return tuple((op, tuple(e for e in elements if e in enabled[f]))
                 for f, op in FUNCTIONS.items() if op is not None)


def _channels(values: dict[str, str], name: str, old: str,
              environ: Mapping[str, str]) -> int | None:
    """NCCL_PARAM integers: the new name wins over the legacy one (connect.cc)."""
    if name in values and values[name].strip():
        return strtoll(values[name])
    if environ.get(old, "").strip():
        return strtoll(environ[old])
    return None
