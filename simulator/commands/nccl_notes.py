"""What NCCL's environment variables changed, in words, for `collective` and `run` output.

``env_of(environ)`` reads them as NCCL does (nccl/env.py); ``env_notes`` compares NCCL over a
machine under them with NCCL over the same machine without them: which GPU pairs changed
transport, and for collectives which algorithm, protocol or channel count NCCL now runs
instead of its own choice. A variable that changes nothing says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simulator import api


def env_of(environ: Mapping[str, str]) -> api.NcclEnv:
    return api.NcclEnv.from_environ(environ)


def env_notes(comm: api.Communicator, plain: api.Communicator, chosen: Sequence[api.Result],
              baseline: Sequence[api.Result]) -> list[str]:
    """Transport changes, then every size whose NCCL choice differs from NCCL's own."""
    env = comm.env
    if not env.active:
        return []
    lines = [f"NCCL environment (read as NCCL reads it): {env.line()}"]
    lines += [f"{text}: ignored, as NCCL ignores it" for text in env.ignored]
    lines += api.transport_effects(comm, plain)
    changed = False
    for attr, name in (("algorithm", "algorithm"), ("protocol", "protocol"),
                       ("n_channels", "channels")):
        diffs = [(getattr(a, attr), getattr(b, attr)) for a, b in zip(chosen, baseline,
                                                                      strict=True)
                 if getattr(a, attr) != getattr(b, attr)]
        if diffs:
            changed = True
            now = sorted({str(d[0]) for d in diffs})
            was = sorted({str(d[1]) for d in diffs})
            lines.append(f"{name}: {'/'.join(now)} where NCCL would choose {'/'.join(was)} "
                         f"({len(diffs)} of {len(chosen)} sizes)")
    if not changed and len(lines) == 1 + len(env.ignored):
        lines.append("these change nothing on this machine")
    return lines
