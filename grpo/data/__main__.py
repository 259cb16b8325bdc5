"""python -m grpo.data validate PATH [--transform module:function]

checks a dataset file (or folder) row by row: exit 0 when clean, 1 with the bad lines listed.
"""
from __future__ import annotations

import sys
from pathlib import Path

from grpo.config.cli import ArgumentParser
from grpo.data import formats
from grpo.data.sources import DatasetUnavailable


def main(argv: list[str] | None = None) -> int:
    """`python -m grpo.data validate PATH [--transform module:function]`."""
    # the subcommand's parser is of the same class (argparse makes it so): exact flags there too
    parser = ArgumentParser(prog="python -m grpo.data", usage="%(prog)s validate PATH [--transform module:function]",
                            description="check a dataset file or folder row by row")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", prog="python -m grpo.data validate", help="check a dataset file or folder row by row",
                           usage="%(prog)s PATH [--transform module:function]")
    check.add_argument("path", help="a .jsonl/.json/.parquet/.csv file, or a folder of them")
    check.add_argument("--transform", default="", help="module:function applied to each row first")
    args = parser.parse_args(argv)
    path = Path(args.path).expanduser()
    try:
        if not path.exists():
            raise DatasetUnavailable(f"{args.path!r} does not exist; pass a dataset file or folder")
        bad = formats.validate_path(path, formats.load_transform(args.transform))
    except (DatasetUnavailable, formats.RowError, formats.PluginError) as exc:
        print(f"python -m grpo.data: error: {exc}", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
