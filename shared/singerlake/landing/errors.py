"""The errors of landing/ (SPEC.md §10): a batch that could not be written or committed, and the stop SIGTERM asks for."""

from __future__ import annotations

from singerlake.errors import SingerlakeError


class LandingError(SingerlakeError, RuntimeError):
    """Writing or committing a batch failed; nothing of that batch is visible, earlier ones are."""


class Terminated(SingerlakeError):
    """Raised into the reading loop by SIGTERM: stop reading, then drain and commit what we have."""
