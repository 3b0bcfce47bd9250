"""What the manifest records of the machine (tracer.session.manifest): the device name from NVML
for the CUDA device the rank uses, and the CPUs the process may run on."""

from __future__ import annotations

import sys
import types

from tracer.session.manifest import _device_name


def test_device_name_comes_from_nvml_for_the_visible_device(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda index: f"handle{index}",
        nvmlDeviceGetName=lambda handle: {"handle5": b"NVIDIA H200"}[handle])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _device_name(1) == "NVIDIA H200"  # CUDA device 1 is physical GPU 5
    assert calls == ["init", "shutdown"]
    assert _device_name(2) is None  # not visible: no name, no exception


def test_cpus_are_the_processs_affinity_else_the_hosts_count(monkeypatch):
    import os

    from tracer.session.manifest import process_cpu_ids, process_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 0}, raising=False)
    assert process_cpus() == 2 and process_cpu_ids() == [0, 1]
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert process_cpus() == 6 and process_cpu_ids() is None
