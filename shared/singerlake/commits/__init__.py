"""Locks with leases (SPEC.md §8) and fenced compare-and-swap commits (§9)."""
