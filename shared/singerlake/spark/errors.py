"""The errors of spark/: one family, ``SparkError``, each a ``SingerlakeError`` whose message names the thing at fault."""

from __future__ import annotations

from singerlake.errors import SingerlakeError


class SparkError(SingerlakeError):
    """Spark: a session that could not start, executors that cannot run the core, streams a lake job could not finish."""


class JavaMissing(SparkError, RuntimeError):
    """No Java 17+ to start Spark with; the message says how to get one."""


class SparkStartError(SparkError, RuntimeError):
    """Spark did not start; the message carries its reason."""


class ExecutorsNotReady(SparkError, RuntimeError):
    """The cluster's executors cannot run the core (a library missing, another Python)."""


class StreamsFailed(SparkError):
    """Raised by a lake job called without a list to collect failures in, once the other streams finished."""

    def __init__(self, failures: list):  # of runner.StreamFailure
        super().__init__("; ".join(map(str, failures)))
        self.failures = failures
