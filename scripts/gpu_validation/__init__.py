"""Validate ranktrace's GPU paths on a real GPU, in one command, with one verdict.

    python scripts/gpu_validation OUTDIR [--quick] [--cpu] [--budget S] [--wheels DIR]
    python scripts/gpu_validation --install-fixtures OUTDIR/fixtures.tar
    python scripts/gpu_validation --list-checks

(`python -m scripts.gpu_validation ...` from the repository root does the same.)

Made for a machine with an NVIDIA GPU, torch with CUDA and NCCL, and nvidia-ml-py; no network is
needed. It traces each workload under the tracer (DP in one process; DDP, model parallel and the
pipeline under torchrun with world size 1 on NCCL), checks what the tracer wrote (CUDA kernels in
the traces, CUDA-event timing of NCCL collectives, real NVML samples, CUDA memory peaks), runs
`python -m analysis.breakdown RUN --format json` on every run and checks that the breakdown adds
up (and, where the `hta` package is importable, matches HTA's temporal breakdown), times the
tracer's overhead, and writes into OUTDIR:

    results.json   every check: name, status (passed/failed/skipped), passed, figure, detail
    results.md     the same, readable, failing checks first
    fixtures.tar   gpu/<workload>/ run folders (traces + records) and gpu/provenance.jsonl:
                   the test fixtures for tests/unit/rank/test_gpu_fixtures.py (--install-fixtures)
    logs.tar.gz    every subprocess's output, the analysis documents, the overhead timings

Four files, one level deep, easy to copy off the GPU machine.

`--cpu` runs the same flow without a GPU (gloo, psutil) and marks every GPU-only check "skipped: no
GPU (--cpu)"; this is how tests/integration/test_gpu_validation_cpu_mode.py exercises it. The whole
run keeps within --budget seconds (every subprocess has a timeout cut to what is left); the exit
status is 0 only when no check failed. See docs/gpu-validation.md.

The package imports only the standard library; everything else runs in subprocesses, so that a
machine without pandas or msgspec still gets a clear preflight verdict instead of a traceback.

Modules, in the order a run uses them: config (modes and bars), results (the checks and their
record), runner (subprocesses under the time budget), preflight, run_checks and run_folder (each
traced workload), analysis_checks (the breakdown and HTA), overhead (the tracer's cost per step,
stamped by benchmarks/overhead_probe.py), outdir (fixtures.tar, logs, layout), install_fixtures,
cli.
"""
