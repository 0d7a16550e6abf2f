"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os

# Tests run many small models and servers side by side on 2 cores: keep each torch process to one thread.
os.environ.setdefault("LIGHTRAIL_TORCH_THREADS", "1")
