from analysis.scaling import main

raise SystemExit(main())
