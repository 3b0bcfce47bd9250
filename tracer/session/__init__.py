"""One rank's tracing session: the run folder, the manifest, the parts it builds from the part
registry, and how the script ended; the launcher of the ranks a script starts itself, and their
sessions (docs/tracer.md)."""
