"""``python -m headwidget.cli``: the same as the ``headwidget`` console script."""

from headwidget.cli import main

raise SystemExit(main())
