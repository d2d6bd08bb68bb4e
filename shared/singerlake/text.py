"""Text for people, shared by the jobs and the CLI: a count with its noun, singular or plural."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``, ``1,200 files``, ``1 push``/``3 pushes`` (``plural`` given)."""
    return f"{number:,} {noun if number == 1 else plural or noun + 's'}"
