"""Run by LLaMA-Factory's interpreter, never imported by lightrail: ``python -P _llamafactory_entry.py train.yaml rows.jsonl``.

Saves lightrail's rows (``input_ids``, ``labels``) as LLaMA-Factory's tokenized dataset at the config's
``tokenized_path`` (a `datasets.DatasetDict` with a ``train`` split, what its loader reads back with
``load_from_disk``), then runs LLaMA-Factory's own entry point (``run_exp``, what ``llamafactory-cli train`` calls)
on the config. Only the standard library, PyYAML, datasets and LLaMA-Factory: lightrail is not installed there.
"""

import json
import os
import sys


def main(config_path: str, rows_path: str) -> None:
    import yaml
    from datasets import Dataset, DatasetDict

    with open(config_path) as f:
        config = yaml.safe_load(f)
    with open(rows_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    columns = {
        "input_ids": [r["input_ids"] for r in rows],
        "attention_mask": [[1] * len(r["input_ids"]) for r in rows],
        "labels": [r["labels"] for r in rows],
    }
    DatasetDict({"train": Dataset.from_dict(columns)}).save_to_disk(config["tokenized_path"])
    threads = os.environ.get("LIGHTRAIL_TORCH_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    from llamafactory.train.tuner import run_exp

    run_exp(config)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
