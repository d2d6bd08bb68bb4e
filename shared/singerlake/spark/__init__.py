"""Spark: starting sessions (local, cluster, Connect), finding Java, readying the executors, and running work on them."""
