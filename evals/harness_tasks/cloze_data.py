"""Loader of the cloze tasks' data files (``custom_dataset`` of ``_cloze_template_yaml``): the JSON-lines file named
by the task's ``dataset_kwargs.file``, read from this folder whatever the working directory, as the ``test`` split."""

import json
from pathlib import Path


def load(file: str, **metadata):
    """``datasets.DatasetDict`` with one ``test`` split holding the rows of ``file`` (a name in this folder);
    ``metadata`` (what the harness passes on: model arguments, task metadata) is not used."""
    import datasets

    path = Path(__file__).resolve().parent / file
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no items")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
