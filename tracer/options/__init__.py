"""What the user sets: the tracer's options (one dataclass, its command line and its RANKTRACE_*
variables) and the RANKTRACE_* variables of the analysis, which the tracer lets through
(docs/tracer.md, Options)."""
