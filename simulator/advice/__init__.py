"""Decisions on top of simulated steps: which configuration to pick, and what to buy.

``advise`` (candidates per machine, pruned by memory and by a compute bound, ranked),
``candidates`` and ``spec_text`` (what is weighed, and each candidate in words and as a
command), ``bound``, ``explain`` (the answer's lines), ``fallback`` (what would fit when
nothing does), ``whatif`` (upgrades a buyer can choose, simulated) and ``boxes`` (what a
second box buys, and costs). Everything here calls
``simulator.api``; nothing here models hardware.
"""
