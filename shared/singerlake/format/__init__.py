"""The lake format of SPEC.md: names, layout, schema hash, data files, metadata records, manifests
and their parts, catalogues, record positions and message envelopes. No policy on when to write."""
