"""The training data: JSONL records (records.py) prepared into a token store (prepare.py,
store_writer.py) that every process reads in place (store.py), the samples a run takes from a
store, a JSONL file or the target itself (sources.py), the batch order over them (order.py),
and the command line (cli.py, `python -m dflash.data`)."""

from importlib import import_module
from typing import Any

__all__ = [
    "SELF_GENERATED",
    "Sample",
    "open_data",
    "random_prompts",
    "sample_store",
    "self_generated",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: the store's format (store_format.py) is read without torch.
    if name in __all__:
        return getattr(import_module("dflash.data.sources"), name)
    raise AttributeError(f"module 'dflash.data' has no attribute {name!r}")
