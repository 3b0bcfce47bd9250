"""A process under tracer.hangs.sigterm's SigtermHandling with a stand-in session, for
tests/unit/tracer/hangs/test_sigterm_handling.py:

    python tests/scripts/sigterm_handling.py FOLDER python|stuck_in_c|fork

`python`: SIGTERM comes while the main thread runs Python; `stuck_in_c`: while it is in one long
C call; `fork`: a forked child gets SIGTERM. What the session was asked, or how the child
ended, goes to FOLDER/noted.json; the stack dumps to FOLDER/rank0.stacks.jsonl."""

import json
import os
import signal
import sys
import threading
import time

from tracer.hangs.sigterm import SigtermHandling

FOLDER, CASE = sys.argv[1], sys.argv[2]


def note(**values):
    with open(os.path.join(FOLDER, "noted.json"), "w") as f:
        json.dump(values, f)


class Session:
    run_dir, rank, opened = FOLDER, 0, True

    def in_use(self, name):
        return None

    def flush_files(self):
        pass

    def end_by_sigterm(self, on_main, wait_s):
        note(ended_on_main=on_main)


def sigterm_soon():
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()


def in_python():
    sigterm_soon()
    while True:
        time.sleep(0.01)


def in_c():
    from datetime import timedelta

    import torch.distributed as dist

    sigterm_soon()
    # One C call that releases the GIL and waits on, as a collective whose peer died does: no
    # Python signal handler runs until it returns.
    dist.HashStore().wait(["never set"], timedelta(seconds=60))


def fork_a_child():
    pid = os.fork()
    if pid == 0:
        default = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        with open(os.path.join(FOLDER, "child.txt"), "w") as f:
            f.write(str(default))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(FOLDER, "child.txt")) as f:
        default = f.read() == "True"
    note(child_exit_signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
         child_sigterm_default=default)


handling = SigtermHandling(Session())
handling.install()
{"python": in_python, "stuck_in_c": in_c, "fork": fork_a_child}[CASE]()
handling.uninstall()
