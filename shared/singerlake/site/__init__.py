"""The lake's documentation site (``singerlake docs``): static HTML pages from the lake's metadata."""
