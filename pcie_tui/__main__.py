from pcie_tui.cli import main

raise SystemExit(main())
