"""The lake jobs (SPEC.md §12) that keep a lake sound: verify, repair, vacuum, compact, upgrade, and describe (`ls`)."""
