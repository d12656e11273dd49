"""Decisions on top of a simulated step: what it costs, what it draws, how sure we are, and
which configuration to pick.

``cost`` (hourly price of the GPUs used, per step, per million tokens, a whole training run,
buy-versus-rent), ``energy`` (power through the step, joules, kWh per million tokens),
``ranges`` (low-high ranges from the validation residuals of the mechanisms a run depends
on), ``advise`` (candidates per machine, pruned by memory, ranked) and ``whatif`` (upgrades a
buyer can choose). Everything here calls ``simulator.api``; nothing here models hardware.
"""
