"""The tools the tests share: lakes and Singer messages, S3 servers, processes held or killed at a step,
CLI sessions, storage wrappers, Spark job measurements. Test modules import from here, never from
each other (pytest puts tests/ on sys.path through its conftest.py, so this package is ``support``)."""
