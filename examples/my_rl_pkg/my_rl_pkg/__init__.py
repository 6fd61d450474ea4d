"""An example of the user's own package for rllib-runner: a gymnasium env, an RLModule
and a callback, named from YAML in ../conf (a user config dir).

Importing the package registers the env with gymnasium, so `env.id=my_rl_pkg:MyRL/Corridor-v0`
(gymnasium's `module:EnvId` form) works as well as `env.entry_point=my_rl_pkg.envs:Corridor`.
"""

import gymnasium as gym

gym.register("MyRL/Corridor-v0", entry_point="my_rl_pkg.envs:Corridor", max_episode_steps=100)
