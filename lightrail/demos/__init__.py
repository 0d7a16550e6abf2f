"""Demos that ship with lightrail (``lightrail demo``): self-contained, so an installed package runs them without the
repository's ``examples/``. Each demo's modules import their heavy dependencies (openai, torch) only when used."""
