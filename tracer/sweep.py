"""`python -m tracer.sweep`: the scaling sweep, ranktrace.sweep (docs/scaling.md)."""

import sys

from ranktrace.sweep import main

if __name__ == "__main__":
    sys.exit(main())
