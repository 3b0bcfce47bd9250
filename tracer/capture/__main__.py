from tracer.capture.capture_command import main

raise SystemExit(main())
