"""Loaders and the metric of the local lm-eval tasks (their data lies beside this file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

HERE = Path(__file__).resolve().parent


def local_qa(**kwargs: Any) -> dict[str, datasets.Dataset]:
    rows = [json.loads(line) for line in (HERE / "local_qa.jsonl").read_text().splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}


def contains_answer(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """1 when the generated text contains the answer (case-insensitive), else 0."""
    return {"contains": float(doc["answer"].lower() in results[0].lower())}
