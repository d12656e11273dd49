"""Write each preset folder's ``index.json``: the facts `stepsim presets` lists, read once from
the YAML, with a checksum of every file (simulator/inputs/catalog.py).

    python scripts/presets_index.py           # rewrite topologies/index.json, workloads/index.json
    python scripts/presets_index.py --check   # exit 1 if either is out of date

Run it after adding or editing a bundled preset (tests/test_presets_index.py says when).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's simulator, not an installed copy

from simulator.api import listing as catalog  # noqa: E402


def text(kind: str) -> str:
    return json.dumps(catalog.index(kind), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    stale = []
    for kind in catalog.KINDS:
        path = ROOT / kind / catalog.INDEX
        new = text(kind)
        if path.is_file() and path.read_text(encoding="utf-8") == new:
            continue
        stale.append(str(path.relative_to(ROOT)))
        if not args.check:
            path.write_text(new, encoding="utf-8")
    verb = "out of date" if args.check else "written"
    print(f"{verb}: {', '.join(stale)}" if stale else "indexes current")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
