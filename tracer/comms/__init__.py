"""Records every collective and point-to-point op a training script issues, one CommRecord each
(docs/tracer.md, Collective hooks).

Modules: `recorder` (the front, `CommsRecorder`), `patching` (replacing and restoring torch
functions, the one wrapper skeleton), `timing` (pending ops, CUDA events, futures, `drain`),
`c10d` (torch.distributed functions), `functional` (functional collectives), `ddp` (DDP's
construction and comm hooks), `fsdp` (FSDP's constructors), `owners` (which ops DDP and FSDP
issued), `flight` and `flight_entries` (the ops torch issues from C++, from its Flight
Recorder)."""

from tracer.comms.recorder import CommsRecorder, open_comms

__all__ = ["CommsRecorder", "open_comms"]
