"""Replay (SPEC.md §11): a stream exactly, in order, from a bookmark (the tap), and the Spark data source."""
