"""`python scripts/gpu_validation OUTDIR` or `python -m scripts.gpu_validation OUTDIR`."""

import sys

if __package__:
    from .cli import main
else:  # run as a folder: its parent, scripts/, makes it importable as a package
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gpu_validation.cli import main

sys.exit(main())
