"""A run's pass criterion, as RLlib's tuned examples state one (their `--as-test` mode):
`metric` reaches `threshold` within an env-step budget. Where no source states a
threshold (`check.baseline=random`), the run measures a random policy's return before it
trains and the threshold is that return plus `baseline_stds` of its standard deviations.

The training loop feeds `Check.update` each iteration's flattened result; the check
says when the run may stop (passed, or the budget spent) and what summary.json records.
A run whose check did not pass exits 1, as RLlib's `--as-test` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.errors import RunnerError
from runner.settings.schema import CheckConfig, CheckOn


class CheckFailed(RunnerError):
    """The run ended without reaching its check's threshold (exit code 1, not 2: the
    input was fine, the result was not)."""

    exit_code = 1


@dataclass
class Check:
    """The state of one run's check: the metric's best value and when it passed."""

    config: CheckConfig
    value: float | None = None  # the metric's latest value (the last known one)
    best: float | None = None
    env_steps_to_threshold: float | None = None
    seconds_to_threshold: float | None = None
    threshold: float | None = None  # the config's, or the one measured from the baseline
    baseline: dict[str, Any] | None = None  # the random policy's returns, when measured

    def __post_init__(self) -> None:
        self.threshold = self.config.threshold

    @property
    def active(self) -> bool:
        config = self.config
        return config.enabled and (config.threshold is not None or config.baseline is not None)

    @property
    def needs_baseline(self) -> bool:
        return self.active and self.config.baseline is not None and self.baseline is None

    def set_baseline(self, returns: list[float], seed: int | None) -> str:
        """The threshold from a random policy's episode returns; the line that says so."""
        mean, std = float(np.mean(returns)), float(np.std(returns))
        self.threshold = mean + self.config.baseline_stds * std
        self.baseline = {
            "policy": "random",
            "episodes": len(returns),
            "seed": seed,
            "return_mean": mean,
            "return_std": std,
            "stds": self.config.baseline_stds,
        }
        return (
            f"check: a random policy returned {mean:.1f} +- {std:.1f} over {len(returns)} "
            f"episodes; threshold {self.threshold:.1f} (its mean + {self.config.baseline_stds:g} "
            "std)"
        )

    def describe(self) -> str:
        """The criterion in one line, for the run's start ('' where none is active)."""
        if not self.active:
            return ""
        config = self.config
        threshold = (
            f"a random policy's return + {config.baseline_stds:g} std (measured first)"
            if self.threshold is None
            else f"{self.threshold:g}"
        )
        budget = f" within {config.env_steps:,} env steps" if config.env_steps else ""
        source = f" ({config.source})" if config.source else ""
        return (
            f"check: {self.metric} >= {threshold}{budget}, stopping once decided; exit 1 if "
            f"missed{source}"
        )

    @property
    def metric(self) -> str:
        """Where `metric` is read: the training result, or (check.on=evaluation) the
        evaluation's within it."""
        on_evaluation = self.config.on == CheckOn.evaluation
        return f"evaluation/{self.config.metric}" if on_evaluation else self.config.metric

    @property
    def passed(self) -> bool:
        return self.env_steps_to_threshold is not None

    def update(self, metrics: dict[str, float], env_steps: float, seconds: float) -> str | None:
        """Take one iteration's metrics; the stop reason when the check is decided."""
        if not self.active or self.threshold is None:
            return None
        config = self.config
        if self.metric in metrics:  # absent when no episode ended (SAC, DQN): keep the last
            self.value = metrics[self.metric]
            self.best = self.value if self.best is None else max(self.best, self.value)
        if self.value is not None and self.value >= self.threshold:
            self.env_steps_to_threshold, self.seconds_to_threshold = env_steps, seconds
            return (
                f"check passed: {self.metric} {self.value:.4g} >= {self.threshold:g} "
                f"at {env_steps:,.0f} env steps"
            )
        if config.env_steps is not None and env_steps >= config.env_steps:
            return f"check failed: {self._shortfall()}"
        return None

    def _shortfall(self) -> str:
        best = "no value" if self.best is None else f"best {self.best:.4g}"
        budget = f" within {self.config.env_steps:,} env steps" if self.config.env_steps else ""
        threshold = "no threshold" if self.threshold is None else f"{self.threshold:g}"
        return f"{self.metric} {best} < {threshold}{budget}"

    def to_dict(self) -> dict[str, Any]:
        """summary.json's `check` section."""
        return {
            "enabled": self.active,
            "metric": self.metric,
            "threshold": self.threshold,
            "baseline": self.baseline,
            "env_steps_budget": self.config.env_steps,
            "source": self.config.source,
            "passed": self.passed if self.active else None,
            "best": self.best,
            "env_steps_to_threshold": self.env_steps_to_threshold,
            "seconds_to_threshold": self.seconds_to_threshold,
        }

    def raise_if_failed(self) -> None:
        """After summary.json is written: a check that did not pass is exit code 1."""
        if self.active and not self.passed:
            source = f" ({self.config.source})" if self.config.source else ""
            raise CheckFailed(f"check failed: {self._shortfall()}{source}")
