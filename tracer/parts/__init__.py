"""What every part of the tracer is: the Part interface, the `ranktrace` logger its one failure
line goes through, and the files parts write through (the buffered file, the JSON-lines record
files, the TensorBoard event file). The parts that observe the script are in tracer.probes and
tracer.comms; the session builds them all from tracer.session.part_registry."""
