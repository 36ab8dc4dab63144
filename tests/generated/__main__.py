"""``python -m tests.generated <directory>``: write every generated file there."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from tests.generated import build_all


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.generated <directory>")
    rows = build_all(Path(sys.argv[1]))
    for group, count in sorted(Counter(r.path.split("/", 1)[0] for r in rows).items()):
        print(f"{group:<10} {count:3d} files")


if __name__ == "__main__":
    main()
