"""Outputs, pure functions of a Timeline: metrics and JSON (``report``), the Chrome trace
(``trace``), pictures (``plots``), and writing files all or nothing (``files``)."""
