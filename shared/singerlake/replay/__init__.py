"""Replay (SPEC.md §11): a stream exactly, in order, from a bookmark (the tap), and the planned files read in bulk."""
