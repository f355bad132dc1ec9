from hwbench.cli import main

raise SystemExit(main())
