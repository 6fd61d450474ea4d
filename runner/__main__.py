"""`python -m runner [overrides]`: the Hydra app, with every error reduced to one line."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

START = time.perf_counter()

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from runner import CONFIG_DIR  # noqa: E402
from runner.errors import RunnerError, one_line  # noqa: E402
from runner.results import RESULT_FILES  # noqa: E402
from runner.schema import register_configs  # noqa: E402


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> None:
    from runner.app import run

    try:
        run(cfg, START)
    except RunnerError as ex:
        _fail(one_line(ex))
    except Exception as ex:
        # A crash (not bad input): one line here, the whole traceback in the run dir.
        error_file = Path(HydraConfig.get().runtime.output_dir) / "error.txt"
        error_file.write_text("".join(traceback.format_exception(ex)))
        _fail(f"{one_line(ex)} (traceback in {error_file})")


def _fail(message: str) -> None:
    """Print one line and exit 2; SystemExit passes through Hydra without its own banner."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _refuse_used_run_dir(argv: list[str]) -> None:
    """Hydra writes .hydra/ before the task runs: refuse a run dir that holds results first."""
    for arg in argv:
        if arg.startswith("hydra.run.dir="):
            run_dir = Path(arg.split("=", 1)[1])
            if any((run_dir / name).exists() for name in RESULT_FILES):
                _fail(
                    f"run dir '{run_dir}' already holds a run's results; choose a new "
                    f"hydra.run.dir, or continue that run with resume={run_dir}"
                )


def main() -> None:
    """Run the app; Hydra's errors propagate (HYDRA_FULL_ERROR) so they can be one line."""
    register_configs()
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    _refuse_used_run_dir(sys.argv[1:])
    try:
        _app()
    except Exception as ex:
        _fail(one_line(ex))


if __name__ == "__main__":
    main()
