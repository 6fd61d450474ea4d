"""Episodes as an EnvRunner returns them, made here with random actions (the fast
off-policy step's tests)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode


def chunks(
    seed: int, steps: int, chunk: int, env_id: str = "CartPole-v1", limit: int = 40
) -> list[list[SingleAgentEpisode]]:
    """Random-action episodes of `env_id` (at most `limit` steps) as an EnvRunner's
    sample calls return them: `chunk` steps per env per call, an unfinished episode
    continued (same id) in the next call's chunks; two envs, so the chunks of different
    episodes interleave. Rewards are random normals (distinct n-step returns)."""
    envs = [gym.make(env_id, max_episode_steps=limit) for _ in range(2)]
    rng = np.random.default_rng(seed)
    episodes = []
    for i, env in enumerate(envs):
        env.action_space.seed(seed + i)
        obs, _ = env.reset(seed=seed + i)
        episodes.append(SingleAgentEpisode(observations=[obs]))
    calls: list[list[SingleAgentEpisode]] = []
    for _ in range(steps // chunk):
        call = []
        for i, env in enumerate(envs):
            for _ in range(chunk):
                episode = episodes[i]
                action = env.action_space.sample()
                obs, _, terminated, truncated, _ = env.step(action)
                episode.add_env_step(
                    obs, action, float(rng.normal()), terminated=terminated, truncated=truncated
                )
                if episode.is_done:
                    episode.to_numpy()
                    call.append(episode)
                    obs, _ = env.reset()
                    episodes[i] = SingleAgentEpisode(observations=[obs])
            if len(episodes[i]) > 0:
                done_part = episodes[i]
                episodes[i] = done_part.cut()
                done_part.to_numpy()
                call.append(done_part)
        calls.append(call)
    return calls
