"""target-singerlake: lands Singer streams in a Singerlake."""
