"""Hangs and how a rank stops: stack dumps, and SIGTERM and SIGUSR1 under the tracer
(docs/tracer.md, Hangs and stack dumps)."""
