"""The ``singerlake`` command."""
