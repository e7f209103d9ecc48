"""`make bench`: run every benchmark, print its table, exit non-zero if a target is missed."""

import argparse
import sys

from bench import pool


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", choices=["pool", "grading", "lint", "class"], help="run one benchmark")
    args = ap.parse_args(argv)
    ok = True
    if args.only in (None, "pool"):
        ok &= pool.main()
    if args.only in (None, "grading"):
        try:
            from bench import grading
        except ImportError as e:  # pragma: no cover - grading bench lands with issue 6
            print(f"grading benchmark unavailable: {e}")
        else:
            ok &= grading.main()
    if args.only in (None, "lint"):
        from bench import lint

        ok &= lint.main()
    if args.only in (None, "class"):
        from bench import class_grading

        ok &= class_grading.main()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
