"""``python -m lightrail.cli`` is the ``lightrail`` command (how the trainer starts its store server child)."""

import sys

from lightrail.cli import main

sys.exit(main())
