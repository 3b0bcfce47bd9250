"""`--install-fixtures TAR`: unpack a GPU run's fixtures.tar into tests/data/gpu/."""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
from pathlib import Path


def install_fixtures(tar_path: Path, dest: Path, allow_cpu: bool) -> int:
    if not tar_path.is_file():
        print(f"gpu_validation: error: {tar_path} is not a file", file=sys.stderr)
        return 2
    with tarfile.open(tar_path) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        bad = [n for n in names if n.startswith("/") or ".." in Path(n).parts
               or not n.startswith("gpu/")]
        bad += [m.name for m in members if not (m.isfile() or m.isdir())]
        if bad:
            print(f"gpu_validation: error: {tar_path} has unexpected members {bad[:5]}",
                  file=sys.stderr)
            return 2
        provenance = {}
        if "gpu/provenance.jsonl" in names:
            provenance = json.loads(tar.extractfile("gpu/provenance.jsonl").read().decode())
        if provenance.get("partial"):
            print(f"gpu_validation: warning: {tar_path} comes from a run that stopped early; "
                  f"check its results.md before committing these fixtures", file=sys.stderr)
        if provenance.get("mode") != "gpu" and not allow_cpu:
            print(f"gpu_validation: error: {tar_path} was made in mode "
                  f"{provenance.get('mode')!r}, not on a GPU; tests/data/gpu/ takes GPU traces "
                  f"only (--allow-cpu overrides, for testing the installer)", file=sys.stderr)
            return 1
        if dest.exists():
            shutil.rmtree(dest)  # one fixture set, from one validation run
        dest.mkdir(parents=True)
        count = 0
        for member in members:
            if not member.isfile():
                continue
            target = dest / Path(member.name).relative_to("gpu")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    folders = sorted(p.name for p in dest.iterdir() if p.is_dir())
    print(f"installed {count} files into {dest}: {', '.join(folders)} (made "
          f"{provenance.get('created')} on {provenance.get('device_name') or 'no GPU'}); run "
          f"`python -m pytest tests/unit/rank/test_gpu_fixtures.py`, then commit {dest}")
    return 0
