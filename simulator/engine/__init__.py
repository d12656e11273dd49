"""The step engine, free of physics: a ``Program`` (tasks on streams) runs on SimPy streams and
one shared flow-level ``Fabric`` of links, and comes out as a ``Timeline`` of spans.

``program`` (the strategy -> engine contract), ``fabric`` (max-min fair flows on links),
``core`` (the event loop: ``simulate``), ``timeline`` (spans and link usage). ``simulate``
loads the event loop on first use: a collective timed alone needs only the fabric.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.engine.core import simulate

__all__ = ["simulate"]


def __getattr__(name: str) -> Any:
    if name == "simulate":
        from simulator.engine.core import simulate

        return simulate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
