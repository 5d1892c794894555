"""Which of dlmkit's files one command runs code in: an architecture figure (docs/architecture.md).

    python bench/walk.py -- generate --model RUN/final --prompt 'rev abc'

runs ``dlmkit <args>`` twice in this process, the second time under a profiler hook, and
prints, per package, the files whose functions that run called (the first run imports what the
command needs, so import-time code is not counted: only calls made while the command works).
``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def walk(argv: list[str]) -> dict[str, list[str]]:
    """``{package: [files]}`` of the dlmkit files whose code ``dlmkit argv`` calls."""
    import dlmkit
    from dlmkit.cli import main

    root = Path(dlmkit.__file__).parent
    seen: set[str] = set()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name != "<module>":
            path = frame.f_code.co_filename
            if path.startswith(str(root)):
                seen.add(path)

    try:  # imports everything the command needs
        main(argv)
    except SystemExit:
        pass
    sys.setprofile(hook)
    try:
        main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    packages: dict[str, list[str]] = defaultdict(list)
    for path in sorted(seen):
        rel = Path(path).relative_to(root.parent)
        packages["/".join(rel.parts[1:-1]) or "."].append(str(rel))
    return dict(packages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="python bench/walk.py [--json] -- DLMKIT ARGS...")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the dlmkit command line")
    args = parser.parse_args()
    argv = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not argv:
        parser.error("give the dlmkit command after --, e.g. -- generate --model RUN/final "
                     "--prompt 'rev abc'")
    packages = walk(argv)
    files = sum(len(v) for v in packages.values())
    if args.json:
        print(json.dumps({"command": argv, "files": files, "packages": packages}))
        return 0
    print(f"{files} files in {len(packages)} packages", file=sys.stderr)
    for package, paths in packages.items():
        print(f"{package}: {', '.join(Path(p).name for p in paths)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
