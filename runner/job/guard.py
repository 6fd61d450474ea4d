"""The non-finite guard: a NaN or inf where training cannot recover from it.

A Learner loss or gradient norm that is not finite means the weights just written are
broken; an episode return that is not finite means the env (or a reward wrapper) is.
Either way every later iteration is wasted and its checkpoint would overwrite good
weights, so by default the run stops at once (`guard.non_finite`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from typing import Any

RETURNS = ("episode_return_mean", "module_episode_returns_mean", "agent_episode_returns_mean")


def _leaves(result: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, f"{name}/")
        else:
            yield name, value


def watched(name: str) -> bool:
    """Learner losses and gradient norms, and the episode returns the EnvRunners report."""
    if name.startswith("learners/"):
        leaf = name.rsplit("/", 1)[-1]
        return "loss" in leaf or leaf.endswith("global_norm")
    parts = name.split("/")
    return parts[0] == "env_runners" and any(p in RETURNS for p in parts[1:])


def _counts(name: str, result: dict) -> bool:
    """Whether a watched metric says something this iteration. An episode return counts
    only in an iteration that ended episodes: in one that ended none, RLlib reports a NaN
    mean once earlier episodes exist (SAC and DQN, often), and in one whose only
    EnvRunner was lost none reports num_episodes (absent or NaN). A module's losses count
    only where it trained (num_module_steps_trained): on no samples (its EnvRunner lost)
    RLlib reports NaN losses of an update that did not happen, and a NaN count."""
    section, _, rest = name.partition("/")
    if section == "env_runners":
        count = (result.get("env_runners") or {}).get("num_episodes", 0)
    else:
        count = ((result.get("learners") or {}).get(rest.partition("/")[0]) or {}).get(
            "num_module_steps_trained", 0
        )
    return bool(count > 0)  # NaN compares False


def non_finite(result: dict) -> dict[str, float]:
    """The watched metrics of one RLlib result that are NaN or inf, by path (`_counts`:
    only those that say something this iteration)."""
    return {
        name: float(value)
        for name, value in _leaves(result)
        if isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and not math.isfinite(float(value))
        and watched(name)
        and _counts(name, result)
    }


def describe(found: dict[str, float], iteration: int) -> str:
    first, value = next(iter(sorted(found.items())))
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"non-finite {first} = {value} at iteration {iteration}{more}"
