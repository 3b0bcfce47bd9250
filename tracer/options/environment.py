"""The RANKTRACE_* environment variables, the tracer's and the analysis's, kept apart.

The tracer's are its options (tracer.options.config: RANKTRACE_<FIELD> for each TracerConfig
field), and an unknown RANKTRACE_* variable stops it, so that a typo never falls back to a default.
The analysis's are listed here, once, for the tracer to let them through: a user exports them in
the shell that runs both. No tracer option may take one of their names (tests/unit/tracer/
options/test_config.py). The analysis reads them; this module imports nothing, so both sides may.
"""

PREFIX = "RANKTRACE_"

# The most JSON one trace file may hold, in MB (analysis.core.limits; docs/analysis.md).
MAX_TRACE_ENV = PREFIX + "MAX_TRACE_MB"

ANALYSIS_VARIABLES: tuple[str, ...] = (MAX_TRACE_ENV,)
