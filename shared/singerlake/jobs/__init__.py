"""The lake jobs (SPEC.md §12): verify, repair, vacuum, compact, upgrade, project, sql, describe, docs."""
