"""The settings: the schema Hydra composes into, the overrides, the one check, and the
step that resolves compile=auto and scaling=auto."""
