from ranktrace.watch.command import main

raise SystemExit(main(prog="python -m ranktrace.watch"))
