"""The parts that observe the script, its device and its processes: the profiler driver, the
device sampler, the memory readers, the clock sync, the peak measurement and the spawn watch
(the collective hooks are tracer.comms)."""
