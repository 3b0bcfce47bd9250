"""One rank's collective and p2p ops: from the tracer's records or from the trace's events, with
their sizes, issuers and enclosing spans, and the collectives table."""
