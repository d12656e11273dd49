"""Outputs, pure functions of what a run produced: metrics and JSON (``report``, ``jsondoc``,
``csvdoc``), cost and energy (``cost``, ``energy``), the Chrome and PyTorch-profiler traces
(``trace``, ``kineto``), pictures (``plots``, ``memory_plot``), nccl-tests' text
(``nccl_tests``), and writing files all or nothing (``files``)."""
