"""Run by LLaMA-Factory's interpreter, never imported by lightrail: ``python -P _llamafactory_entry.py train.yaml rows.jsonl``.

Saves lightrail's rows (``input_ids``, ``labels``) as LLaMA-Factory's tokenized dataset at the config's
``tokenized_path`` (a `datasets.DatasetDict` with a ``train`` split, what its loader reads back with
``load_from_disk``), then runs LLaMA-Factory's own entry point (``run_exp``, what ``llamafactory-cli train`` calls)
on the config. It ends when its parent does. Only the standard library, PyYAML, datasets and LLaMA-Factory: lightrail is not installed there.
"""

import json
import os
import sys
import threading
import time


def _exit_with_parent() -> None:
    """End this process when the lightrail process that started it is gone (killed, crashed): a trainer that dies
    must not leave LLaMA-Factory training on its cores."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main(config_path: str, rows_path: str) -> None:
    _exit_with_parent()
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
