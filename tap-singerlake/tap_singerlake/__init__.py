"""tap-singerlake: replays a Singerlake."""
