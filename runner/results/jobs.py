"""A sweep job's record (job.json), read by the sweep summary and by a re-run of the sweep.

Every job leaves `job.json` in its dir: finished, failed with its one-line error, or
dry_run. A re-run of the sweep skips a job whose record says it finished with the same
overrides, and moves the files of an earlier failed or unfinished attempt into
`attempt-N/`, so nothing is lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.results.files import RESULT_FILES, read_overrides, write_atomic

JOB_FILE = "job.json"
ERROR_FILE = "error.txt"


def write_job(job_dir: Path, status: str, overrides: list[str], **fields: Any) -> None:
    record = {"status": status, "overrides": overrides, **fields}
    write_atomic(job_dir / JOB_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_job(job_dir: Path) -> dict[str, Any] | None:
    path = job_dir / JOB_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def earlier_attempt(job_dir: Path, overrides: list[str]) -> tuple[bool, Path | None]:
    """(skip, continue from) for a job of a sweep that runs again in the same dir.

    A finished run of the same overrides is skipped. A failed, interrupted or unfinished
    earlier attempt is moved into attempt-N/ so the job can run again without losing it;
    an interrupted one, or an unfinished one (killed: SLURM's requeue or preemption stops
    a job's Ray with it, a node fails), of the same overrides is continued from its newest
    checkpoint (`continue from` is its attempt dir). A dry-run record is only a plan, and
    is dropped."""
    job = read_job(job_dir)
    if job and job["status"] == "finished" and job["overrides"] == overrides:
        return True, None
    if job and job["status"] == "dry_run":
        (job_dir / JOB_FILE).unlink()
    kept = (*RESULT_FILES, JOB_FILE, ERROR_FILE, "tensorboard")
    leftovers = [p for p in job_dir.iterdir() if p.name in kept]
    if leftovers:
        attempt = job_dir / f"attempt-{1 + len(list(job_dir.glob('attempt-*')))}"
        attempt.mkdir()
        for p in leftovers:
            p.rename(attempt / p.name)
        status = job["status"] if job else "unfinished"
        print(f"{job_dir}: the earlier {status} attempt's files are kept in {attempt.name}/")
        began_with = job["overrides"] if job else read_overrides(job_dir)
        if status in ("interrupted", "unfinished") and began_with == overrides:
            return False, attempt
    return False, None
