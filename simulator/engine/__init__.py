"""The step engine, free of physics: a ``Program`` (tasks on streams) runs on SimPy streams and
one shared flow-level ``Fabric`` of links, and comes out as a ``Timeline`` of spans.

``program`` (the strategy -> engine contract), ``fabric`` (max-min fair flows on links),
``core`` (the event loop: ``simulate``), ``timeline`` (spans and link usage).
"""

from simulator.engine.core import simulate

__all__ = ["simulate"]
