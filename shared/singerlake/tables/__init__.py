"""Tables from the raw zone (SPEC.md §12): the projection to Delta (and Iceberg, CSV), its staging parts, and ``sql``."""
