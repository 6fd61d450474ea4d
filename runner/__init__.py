"""rllib-runner: declarative Hydra experiments for Ray RLlib (new API stack)."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
# A clone keeps conf/ beside the package; a built wheel ships it as runner/conf/.
CONFIG_DIR = str(
    _HERE.parent / "conf" if (_HERE.parent / "conf" / "config.yaml").is_file() else _HERE / "conf"
)
