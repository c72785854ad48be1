"""JSON-lines files (metrics.jsonl, attempts.jsonl), local or in a bucket: one reader for the trainer and sweeps."""

from __future__ import annotations

import json


def read_jsonl(path, problems: list[str] | None = None) -> list[dict]:
    """The JSON objects of a .jsonl file, local or in a bucket ([] if it does not exist). A line that is not a JSON
    object (the last line of a killed process is often cut short) is skipped, and said so in `problems`."""
    from etils import epath

    path = epath.Path(path)
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif problems is not None:
            problems.append(f"{path.name} line {i} is not valid JSON (skipped)")
    return rows
