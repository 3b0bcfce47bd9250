#!/usr/bin/env python3
"""The former command, `python scripts/gpu_validation.py ...`: runs the scripts/gpu_validation
package, which is the same as `python scripts/gpu_validation ...`."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_suffix("")), run_name="__main__")
