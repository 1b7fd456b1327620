"""Fails when git tracks a file over the size limit (1 MiB by default).

Binaries such as wheels or datasets do not belong in the repository; the
vendored dashboard assets under ``api/static/`` are the one allowed exception.

    python .ci/large_files.py [--max-bytes N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED_PREFIXES = ("api/static/",)
MAX_BYTES = 1 << 20


def large_files(root: Path = ROOT, max_bytes: int = MAX_BYTES) -> list[tuple[str, int]]:
    """``(path, size)`` of every tracked file over ``max_bytes`` outside the
    allowed prefixes (files deleted from the work tree are skipped)."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    out = []
    for name in filter(None, names.split("\0")):
        path = root / name
        if name.startswith(ALLOWED_PREFIXES) or not path.is_file():
            continue
        size = path.stat().st_size
        if size > max_bytes:
            out.append((name, size))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-bytes", type=int, default=MAX_BYTES)
    args = ap.parse_args(argv)
    big = large_files(ROOT, args.max_bytes)
    for name, size in big:
        print(f"{name}: {size} bytes, over the {args.max_bytes}-byte limit")
    if big:
        print(
            "Do not commit binaries; allowed only under " + ", ".join(ALLOWED_PREFIXES)
        )
    return 1 if big else 0


if __name__ == "__main__":
    sys.exit(main())
