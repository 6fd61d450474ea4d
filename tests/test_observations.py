"""Observations as users bring them: integer pixels and grids reach RLlib as floats in
[0, 1], an image of any size gets a conv encoder, 2-D frames stack on a new channel
axis, and the preflight runs one real observation through the env-to-module connectors
and the module the EnvRunners build, so a model that does not take it is one line
before any actor starts. Envs: tests/image_env.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import prepared

from runner.algorithms.algorithm_config import conv_filters_for
from runner.envs import make_env
from runner.errors import ConfigError
from runner.machine import preflight

TESTS = Path(__file__).resolve().parent
IMAGES = ["env.id=null", "env.entry_point=image_env:TinyImages"]


pytestmark = pytest.mark.usefixtures("tests_importable")


def test_integer_pixels_reach_rllib_as_floats_in_0_1():
    config = prepared(IMAGES).config
    env = make_env(config)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.dtype == np.float32 and env.observation_space.shape == (16, 16, 3)
    assert obs.dtype == np.float32 and obs.min() >= 0.0 and obs.max() <= 1.0 and obs.max() > 0.5
    cartpole = make_env(prepared().config)
    assert cartpole.observation_space.dtype == np.float32  # a float env passes as it is
    assert not hasattr(cartpole, "func")  # no TransformObservation around it


@pytest.mark.parametrize(
    ("shape", "filters"),
    [
        ((7, 7, 3), [[16, [2, 2], 1], [32, [2, 2], 1], [64, [2, 2], 1]]),
        ((16, 16, 3), [[16, [4, 4], 2]]),
        ((210, 160, 3), [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [4, 4], 2]]),
        ((84, 84, 4), [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]]),  # RLlib's own
    ],
)
def test_a_conv_stack_for_images_of_any_size(shape, filters):
    assert conv_filters_for(shape) == filters


@pytest.mark.parametrize("size", [16, 7])
def test_an_image_env_of_any_size_passes_the_preflight_forward_pass(size: int):
    made = prepared([*IMAGES, f"+env.env_config.size={size}"])
    assert made.config.model_config["conv_filters"] == conv_filters_for((size, size, 3))
    preflight.check_env(made.settings, made.config)  # the connectors and module take it


def test_a_model_config_of_the_users_keeps_its_conv_filters():
    own = "+algo.rl_module.model_config.conv_filters=[[8,[3,3],2]]"
    assert prepared([*IMAGES, own]).config.model_config["conv_filters"] == [[8, [3, 3], 2]]


def test_a_model_that_does_not_take_the_observation_is_one_line_at_preflight():
    """A 9x9 kernel without padding on a 7x7 grid: the module builds, its forward pass
    fails (in every EnvRunner, without the preflight's)."""
    made = prepared(
        [
            *IMAGES,
            "+env.env_config.size=7",
            "+algo.rl_module.model_config.conv_filters=[[16,[9,9],1,valid]]",
        ]
    )
    with pytest.raises(ConfigError) as caught:
        preflight.check_env(made.settings, made.config)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("preflight: env.entry_point=image_env:TinyImages's first observation")
    assert "float32 (7, 7, 3)" in message and "Box(0.0, 1.0, (7, 7, 3), float32)" in message
    assert "algo.rl_module.model_config" in message


def test_framestack_puts_2d_frames_on_a_new_channel_axis():
    made = prepared([*IMAGES, "+env.env_config.channels=null", "env.framestack=4"])
    env = make_env(made.config)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (16, 16, 4) and env.observation_space.shape == (16, 16, 4)
    assert made.config.model_config["conv_filters"] == conv_filters_for((16, 16, 4))
    preflight.check_env(made.settings, made.config)


@pytest.mark.parametrize("name", ["ALE/Pong-v5", "ale_py:ALE/Pong-v5"])
def test_an_ale_id_gets_rllibs_atari_preprocessing_however_it_is_named(name: str):
    """Named alone, an ALE id takes env=atari (4 stacked frames, clipped rewards); under
    another env option it still gets RLlib's Atari wrapper."""
    alone = prepared([f"env.id={name}"])
    assert make_env(alone.config).observation_space.shape == (64, 64, 4)
    assert alone.settings.env.environment == {"clip_rewards": True}
    made = prepared(["env=cartpole", f"env.id={name}"])
    env = make_env(made.config)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (64, 64, 1) and obs.dtype == np.float32  # 64x64 grayscale, scaled
    assert env.unwrapped.spec.kwargs["frameskip"] == 1  # RLlib's wrapper skips frames itself
    preflight.check_env(made.settings, made.config)


def test_env_atari_takes_any_ale_id_and_false_keeps_the_raw_frames():
    made = prepared(["env=atari", "env.id=ALE/Pong-v5"])
    assert make_env(made.config).observation_space.shape == (64, 64, 4)
    raw = prepared(["env=cartpole", "env.id=ALE/Pong-v5", "env.atari=false"])
    env = make_env(raw.config)
    space = env.observation_space
    assert space.shape == (210, 160, 3) and space.dtype == np.float32
    assert raw.config.model_config["conv_filters"] == conv_filters_for((210, 160, 3))


MINIGRID = [
    "env.id=minigrid:MiniGrid-Empty-5x5-v0",
    "env.wrappers=[minigrid.wrappers:ImgObsWrapper]",
]


def test_minigrid_with_its_view_alone_passes_and_a_mismatched_model_is_one_line():
    """The issue's case: MiniGrid's 7x7x3 uint8 view, no other wrapper, gets through the
    preflight's forward pass; a model that cannot take the view stops there."""
    made = prepared(MINIGRID)
    preflight.check_env(made.settings, made.config)
    bad = prepared([*MINIGRID, "+algo.rl_module.model_config.conv_filters=[[16,[9,9],1,valid]]"])
    with pytest.raises(ConfigError, match=r"^preflight: env.id=minigrid:MiniGrid-Empty-5x5-v0's"):
        preflight.check_env(bad.settings, bad.config)
