"""The step engine, free of physics: a ``Program`` (tasks on streams) runs on SimPy streams and
one shared flow-level ``Fabric`` of links, and comes out as a ``Timeline`` of spans.

``program`` (the strategy -> engine contract), ``fabric`` (max-min fair flows on links),
``core`` (the event loop: ``simulate``, and ``step_time`` where only the step's length is
read), ``timeline`` (spans and link usage). Both load the event loop on first use: a
collective timed alone needs only the fabric.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.engine.core import simulate, step_time

__all__ = ["simulate", "step_time"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from simulator.engine import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
