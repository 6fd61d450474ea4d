"""Episodes as video: gymnasium's RecordVideo around the run's env, played by an EnvRunner
of the run's own config in this process, and a PNG strip of frames small enough for a
README.

The EnvRunner is RLlib's: it gets the trained state of the Algorithm's local EnvRunner
(module weights and connector states, e.g. an observation filter), so a video shows the
policy exactly as evaluation runs it. RecordVideo writes mp4 through moviepy, whose ffmpeg
is the one imageio-ffmpeg ships.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
from PIL import Image
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from runner.envs import SETTINGS_KEY, build, make_env, own_settings, setting
from runner.errors import ConfigError

RENDER = "rgb_array"
# pygame (CartPole's and Pendulum's drawing) needs no display or sound device for frames.
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
_VIDEO = "_recorded_env_video"


def check_rendering(env: Any, where: str) -> Any:
    """The env, if it renders rgb_array frames; else closed, and one line saying so."""
    if isinstance(env, MultiAgentEnv):
        raise ConfigError(f"{where}: video records single-agent envs; this one is multi-agent")
    modes = env.metadata.get("render_modes", [])
    if env.render_mode != RENDER or RENDER not in modes:
        env.close()
        raise ConfigError(
            f"{where} cannot render '{RENDER}' frames (render_mode={env.render_mode}, "
            f"render modes {modes}): video needs an env that can; if yours takes a render "
            f"mode in its config, add +env.env_config.render_mode={RENDER}"
        )
    return env


def check_renders(config: AlgorithmConfig) -> None:
    """Make the run's env here, rendering, and draw its first frame: one line before Ray
    starts if it cannot (a missing drawing library included)."""
    where = setting(own_settings(config.env_config))
    made = check_rendering(make_env(config, render_mode=RENDER), where)
    try:
        made.reset(seed=0)
        frame = made.render()
    except Exception as ex:
        raise ConfigError(f"{where}: drawing a frame failed: {type(ex).__name__}: {ex}") from ex
    finally:
        made.close()
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise ConfigError(f"{where}: render() gave {type(frame).__name__}, not an RGB frame")


class RecordedEnv(gym.Wrapper):
    """The run's env from the one factory, rendering, in RecordVideo: a class, so RLlib's
    EnvRunner makes it as it makes any env class (`env_context` also says where to
    record)."""

    def __init__(self, env_context: EnvContext) -> None:
        user_config = {k: v for k, v in env_context.items() if k not in (SETTINGS_KEY, _VIDEO)}
        own, video = env_context[SETTINGS_KEY], env_context[_VIDEO]
        context = env_context.copy_with_overrides(env_config=user_config)
        env = check_rendering(build(own, context, render_mode=RENDER), "the recorded env")
        with warnings.catch_warnings():  # each recording has a prefix of its own
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            recorder: gym.Env = gym.wrappers.RecordVideo(
                env,
                video["folder"],
                episode_trigger=lambda episode: episode < video["episodes"],
                name_prefix=video["prefix"],
                disable_logger=True,
            )
        super().__init__(recorder)


def record(
    config: AlgorithmConfig,
    state: dict[str, Any],
    folder: Path,
    episodes: int,
    explore: bool,
    prefix: str,
) -> list[Path]:
    """Play `episodes` whole episodes with `state` (an EnvRunner's) on one env here, each
    recorded to `folder/<prefix>-episode-<i>.mp4`; returns those files."""
    folder.mkdir(parents=True, exist_ok=True)
    recorded = config.copy(copy_frozen=False)
    video = {"folder": str(folder), "episodes": episodes, "prefix": prefix}
    recorded.environment(env=RecordedEnv, env_config={**config.env_config, _VIDEO: video})
    recorded.env_runners(num_envs_per_env_runner=1, gym_env_vectorize_mode=gym.VectorizeMode.SYNC)
    with warnings.catch_warnings():  # RLlib registers its env id again in this process
        warnings.filterwarnings("ignore", message=".*Overriding environment")
        runner = SingleAgentEnvRunner(config=recorded)
    try:
        runner.set_state(state)
        runner.sample(num_episodes=episodes, explore=explore, random_actions=False)
    finally:
        runner.stop()  # closes RecordVideo, which writes the last episode's file
    return sorted(folder.glob(f"{prefix}-episode-*.mp4"))


def frame_strip(video: Path, out: Path, frames: int = 6, height: int = 120) -> Path:
    """`frames` frames spread over `video`, side by side at `height` pixels: a PNG for a
    README, decoded with the same ffmpeg that wrote the video."""
    reader = imageio.get_reader(video, format="FFMPEG")
    try:
        count = reader.count_frames()  # type: ignore[attr-defined]  # the FFMPEG reader's
        picks = np.linspace(0, count - 1, min(frames, count)).round().astype(int)
        images = [Image.fromarray(reader.get_data(int(i))) for i in picks]
    finally:
        reader.close()
    width = round(images[0].width * height / images[0].height)
    strip = Image.new("RGB", (len(images) * (width + 2) - 2, height), "gray")
    for i, image in enumerate(images):
        strip.paste(image.resize((width, height)), (i * (width + 2), 0))
    strip.save(out)
    return out
