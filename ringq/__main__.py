from ringq.cli.main import main

raise SystemExit(main())
