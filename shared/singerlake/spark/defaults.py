"""The Spark settings of every session we start or attach to (the user's conf comes after them)."""

# Every session: our jobs size their own partitions; the console progress bar would garble stderr.
SESSION_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # Batches go to the JVM as an RDD, not as rows inside the query plan: plan-held batches stay on
    # the heap until the ContextCleaner catches up, and back-to-back jobs then exhaust it.
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    # A JVM out of memory must die (and fail the run), never hang.
    "spark.executor.extraJavaOptions": "-XX:+ExitOnOutOfMemoryError",
}
