"""``python -m lightrail`` is the ``lightrail`` command."""

from lightrail.cli import run

run()
