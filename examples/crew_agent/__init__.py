"""A two-agent CrewAI crew (researcher with a country-facts tool, writer) trained with lightrail; see README.md."""
