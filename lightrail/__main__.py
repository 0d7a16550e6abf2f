"""``python -m lightrail`` is the ``lightrail`` command."""

import sys

from lightrail.cli import main

sys.exit(main())
