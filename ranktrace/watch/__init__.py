"""`ranktrace watch`: a traced job, live, in the terminal (docs/viewing.md).

By concern: `tail` reads what the ranks append, `folders` finds the run's folders, `model`
(with `waits`, `phases`, `series`) turns records into the view, `render` draws it, `command`
runs the loop; `keys` and `liveness` serve it."""

from ranktrace.watch.command import main

__all__ = ["main"]
