"""Any file in the lake (SPEC.md §14): push with its datalake record, find by what, where, time and work id, fetch."""
