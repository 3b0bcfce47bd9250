"""What the tests share: launching scripts (launch), the run table of the integration tests
(runs), and readers and builders of what the tracer writes (tracer_files, run_copies).

Importable as ``helpers`` because pyproject.toml puts tests/ on pytest's pythonpath."""
