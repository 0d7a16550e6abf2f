"""The country table the crew's tool reads and the questions are generated from: ``countries.json`` beside this
file, extracted once from the ``countryinfo`` package by `extract` (``python -m examples.crew_agent.countries``).

The table ships with the example because the crew runs in CrewAI's own environment, where ``countryinfo`` is not
installed; ``tests/examples/test_crew_agent.py`` checks that the file still matches the package. Only countries
with every field and one currency and one calling code are kept, so each question has exactly one answer.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from pathlib import Path

TABLE = Path(__file__).with_name("countries.json")
FIELDS = ("name", "capital", "region", "subregion", "currency", "calling_code", "population")


@functools.cache
def countries() -> tuple[dict, ...]:
    """Every country of the table, sorted by name: dicts with the keys of `FIELDS`."""
    return tuple(json.loads(TABLE.read_text(encoding="utf-8")))


def normalize(text: str) -> str:
    """Lower case, accents and punctuation dropped, spaces collapsed: ``" Côte d'Ivoire."`` -> ``"cote d ivoire"``."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return " ".join(re.sub(r"[^a-z0-9]+", " ", ascii_text.lower()).split())


@functools.cache
def _by_name() -> dict[str, dict]:
    return {normalize(c["name"]): c for c in countries()}


def lookup(name: str) -> dict | None:
    """The country called ``name`` (case, accents and punctuation ignored), or None."""
    return _by_name().get(normalize(name))


def describe(name: str) -> str:
    """The tool's answer: one line of facts, or a message saying the name is unknown (never an exception: a
    model's garbage argument is an ordinary tool result)."""
    country = lookup(name) if isinstance(name, str) else None
    if country is None:
        return f"No country named {name!r}."
    return (
        f"{country['name']}: capital {country['capital']}; region {country['region']}; "
        f"currency {country['currency']}; calling code {country['calling_code']}; "
        f"population {country['population']}."
    )


def extract(countryinfo_data: str | Path) -> list[dict]:
    """The table from ``countryinfo``'s JSON files (one per country) in ``countryinfo_data``."""
    table = []
    for path in sorted(Path(countryinfo_data).glob("*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        currencies, codes = raw.get("currencies") or [], raw.get("callingCodes") or []
        row = {
            "name": raw.get("name"),
            "capital": raw.get("capital"),
            "region": raw.get("region"),
            "subregion": raw.get("subregion"),
            "currency": currencies[0] if len(currencies) == 1 else None,
            "calling_code": codes[0] if len(codes) == 1 else None,
            "population": raw.get("population"),
        }
        complete = all(isinstance(row[k], str) and row[k].strip() for k in FIELDS if k != "population")
        if complete and isinstance(row["population"], int) and row["population"] > 0:
            table.append(row)
    by_name: dict[str, dict] = {}
    for row in table:  # countryinfo has a few files for the same country; keep the first
        by_name.setdefault(normalize(row["name"]), row)
    return sorted(by_name.values(), key=lambda row: row["name"])


def countryinfo_data_dir() -> Path:
    """Where the installed ``countryinfo`` package keeps its JSON files (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("countryinfo")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("countryinfo is not installed (pip install --no-deps countryinfo==1.0.1)")
    return Path(spec.submodule_search_locations[0]) / "data"


if __name__ == "__main__":
    rows = extract(countryinfo_data_dir())
    lines = ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows)  # one country a line: readable diffs
    TABLE.write_text(f"[\n{lines}\n]\n", encoding="utf-8")
    print(f"wrote {len(rows)} countries to {TABLE}")
