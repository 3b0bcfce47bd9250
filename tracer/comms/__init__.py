"""Records every collective and point-to-point op a training script issues, one CommRecord each
(docs/tracer.md, Collective hooks).

Modules: `recorder` (the front, `CommsRecorder`), `patching` (replacing and restoring torch
functions, the one wrapper skeleton), `timing` (pending ops, CUDA events, futures, `drain`),
`c10d` (torch.distributed functions), `functional` (functional collectives), `ddp` (DDP comm
hooks)."""

from tracer.comms.recorder import CommsRecorder, open_comms

__all__ = ["CommsRecorder", "open_comms"]
