"""Spark: starting sessions (local, cluster, Connect), finding Java, and readying the executors."""
