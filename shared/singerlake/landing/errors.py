"""The errors of landing/ (SPEC.md §10): a batch that could not be written or committed, and the stop SIGTERM asks for."""

from __future__ import annotations

from singerlake.errors import ConfigError, SingerlakeError


class LandingError(SingerlakeError, RuntimeError):
    """Writing or committing a batch failed; nothing of that batch is visible, earlier ones are."""


class RootUnusable(LandingError, ConfigError):
    """The run's first requests to the lake root failed, and not for want of an object (a missing bucket,
    refused credentials, an unreachable endpoint): the setting naming the root is at fault."""


class Terminated(SingerlakeError):
    """Raised into the reading loop by SIGTERM: stop reading, then drain and commit what we have."""
