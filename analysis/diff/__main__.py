from analysis.diff import main

raise SystemExit(main())
