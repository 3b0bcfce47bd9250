"""Replacing torch functions and putting the very same objects back, and the one skeleton every
recording wrapper shares (docs/tracer.md, Collective hooks)."""

from __future__ import annotations

import inspect
import sys
import threading
import time

import torch


class ThreadState(threading.local):
    depth = 0  # >0 while inside a wrapped call: inner wrapped calls must not record again
    source = None  # "ddp" while a DDP comm hook runs on this thread
    issuer = None  # a schema.COMM_ISSUERS value while that framework builds a unit on this thread
    coalescing = ()  # stack of (process group, [pending]) for open _coalescing_manager blocks


thread = ThreadState()


def in_compiled_code() -> bool:
    """True while Dynamo traces the caller: a wrapper must then be the original and nothing else."""
    return torch.compiler.is_dynamo_compiling()


def parameter_positions(function) -> dict[str, int]:
    names = list(inspect.signature(function).parameters)
    return {name: i for i, name in enumerate(names)}


def argument(args, kwargs, positions, name, default=None):
    index = positions.get(name)
    if index is not None and index < len(args):
        return args[index]
    return kwargs.get(name, default)


def distributed_modules():
    return [m for n, m in list(sys.modules.items())
            if m is not None and (n == "torch.distributed" or n.startswith("torch.distributed."))]


class Patches:
    """Every attribute replaced, so that `restore` puts back exactly what was there."""

    def __init__(self, fail):
        self._fail = fail
        self._patched: list[tuple[object, str, object]] = []  # (owner, attribute, original)
        self._wrapper_to_original: dict[int, tuple[object, object]] = {}

    def patch(self, owner, name: str, replacement) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._patched.append((owner, name, original))

    def replace_everywhere(self, pairs) -> None:
        """(original, wrapper) pairs: the wrapper replaces its original wherever a loaded
        torch.distributed module holds it by name (DTensor's modules import some that way)."""
        wrapper_of = {}
        for original, wrapper in pairs:
            self._wrapper_to_original[id(wrapper)] = (wrapper, original)
            wrapper_of[id(original)] = (original, wrapper)
        for module in distributed_modules():
            for attr, value in list(vars(module).items()):
                found = wrapper_of.get(id(value))
                if found is not None and found[0] is value:
                    self.patch(module, attr, found[1])

    def restore(self) -> None:
        for owner, name, original in reversed(self._patched):
            try:
                setattr(owner, name, original)
            except Exception as exc:
                self._fail(f"restoring {name}", exc)
        self._patched.clear()
        # Modules imported while installed may have bound a wrapper by name: give them the original.
        for module in distributed_modules():
            for name, value in list(vars(module).items()):
                found = self._wrapper_to_original.get(id(value))
                if found is not None and found[0] is value:
                    setattr(module, name, found[1])


def recording_wrapper(recorder, what: str, original, describe, complete, call_with=None):
    """The wrapper of one torch function that records the ops it issues.

    ``describe(args, kwargs)`` returns what the record needs before the call, or None to pass
    through; ``complete(described, result)`` records after it. ``call_with(described)``, when
    given, calls the original in place of ``original(*args, **kwargs)``. The original is the
    only thing called while Dynamo traces, while the recorder is off and inside another wrapped
    call (the outermost call records). A fault in describe or complete switches the recorder
    off with one line; the user's call still happens once, outside our except blocks, so its
    own errors reach the user as they are.
    """

    def wrapper(*args, **kwargs):
        if in_compiled_code() or not recorder.active or thread.depth:
            return original(*args, **kwargs)
        try:
            described = describe(args, kwargs)
        except Exception as exc:
            failure = exc
        else:
            failure = None
        if failure is not None:
            # Bad arguments make the original raise its own error; if not, the fault is ours.
            result = original(*args, **kwargs)
            recorder.fail(f"recording {what}", failure)
            return result
        if described is None:
            return original(*args, **kwargs)
        thread.depth += 1
        span = open_span(recorder)
        try:
            result = original(*args, **kwargs) if call_with is None else call_with(described)
        except Exception as exc:
            thread.depth -= 1
            close_span(span)
            report_op_error(recorder, exc)
            raise
        thread.depth -= 1
        close_span(span)
        try:
            complete(described, result)
        except Exception as exc:
            recorder.fail(f"recording {what}", exc)
        return result

    return wrapper


def open_span(recorder):
    """[thread, start_ns, None] appended to the recorder's issue_spans (a deque, while the Flight
    Recorder part reads them), or None: the time this thread spends inside one hooked call,
    whose Flight Recorder entries are the hooks' own ops (tracer.comms.flight)."""
    spans = recorder.issue_spans
    if spans is None:
        return None
    span = [threading.get_ident(), time.time_ns(), None]
    spans.append(span)
    return span


def close_span(span) -> None:
    if span is not None:
        span[2] = time.time_ns()


def report_op_error(recorder, exc: BaseException) -> None:
    """The op raised: the recorder writes the stacks; its own failure must not replace the
    user's exception."""
    try:
        recorder.on_op_error(exc)
    except Exception:
        pass
