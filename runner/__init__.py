"""rllib-runner: declarative Hydra experiments for Ray RLlib (new API stack)."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
# A clone keeps conf/ beside the package; a built wheel ships it as runner/conf/.
CONFIG_DIR = str(
    _HERE.parent / "conf" if (_HERE.parent / "conf" / "config.yaml").is_file() else _HERE / "conf"
)

__all__ = ["compose", "run"]


def __getattr__(name: str):
    """`from runner import run, compose` (runner/api.py), imported on first use: the
    package itself stays light for the CLI's start-up."""
    if name in __all__:
        from runner import api

        return getattr(api, name)
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
