"""Landing (SPEC.md §10): the target reads messages into batches; the drain writes each batch in one
Spark job and commits it, stream by stream, before STATE goes out; SchemaWriter holds one stream-schema's lock and commits."""
