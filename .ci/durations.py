"""Markdown tables of a pytest log written with ``--durations=0`` (or
``--durations=N``): the slowest tests (setup + call + teardown) and the time
per test file (the sum of what the log lists).

    python -m pytest -q -n auto --dist loadfile --durations=0 > tf.log
    python .ci/durations.py tf.log [--top=40]

With ``--record=tensorflow`` (or ``jax``) it also writes the time per test
file into tests/file_seconds.json under that backend: the test processes take
the slowest files first from it (tests/conftest.py), so that the last files
left for a process are short ones.
"""

import argparse
import collections
import json
import os
import re

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                      "file_seconds.json")

_LINE = re.compile(r"([\d.]+)s (setup|call|teardown)\s+(\S+?)::(\S.*)")


def read(path):
    tests = collections.Counter()
    for line in open(path, errors="replace"):
        match = _LINE.match(line.strip())
        if match:
            tests[(match[3], match[4])] += float(match[1])
    return tests


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--record", choices=["tensorflow", "jax"],
                        help="write the time per file into tests/file_seconds.json")
    args = parser.parse_args()
    tests = read(args.log)
    if not tests:
        raise SystemExit(f"{args.log}: no durations (run pytest with --durations=0)")
    files = collections.Counter()
    counts = collections.Counter()
    for (file, _), seconds in tests.items():
        files[file] += seconds
        counts[file] += 1
    print(f"{len(tests)} tests listed, {sum(tests.values()):,.0f} s of test time\n")
    print(f"| slowest {args.top} tests | s |\n| --- | ---: |")
    for (file, name), seconds in tests.most_common(args.top):
        print(f"| `{file}::{name}` | {seconds:.1f} |")
    print("\n| test file | tests | s |\n| --- | ---: | ---: |")
    for file, seconds in files.most_common():
        print(f"| `{file}` | {counts[file]} | {seconds:.1f} |")
    if args.record:
        recorded = {}
        if os.path.exists(RECORD):
            with open(RECORD) as f:
                recorded = json.load(f)
        recorded[args.record] = {file: round(seconds, 1) for file, seconds
                                 in sorted(files.items())}
        with open(RECORD, "w") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
