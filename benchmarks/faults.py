"""Every fault of tests/test_faults.py, run for real, with its measured outcome.

    python benchmarks/faults.py

runs the fault tests with FAULT_REPORT set, so each writes what it measured (exit code,
seconds from the fault to the exit, what was kept), and prints them as a Markdown table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "tests/test_faults.py"],
            cwd=ROOT,
            env={**os.environ, "FAULT_REPORT": str(report)},
        )
        rows = [json.loads(line) for line in report.read_text().splitlines()]
    print("| fault | exit code | seconds to exit | counted from | kept |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {r['exit']} | {r['seconds']:.1f} | {r['since']} | {r['kept']} |")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
