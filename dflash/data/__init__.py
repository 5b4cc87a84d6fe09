"""The training data: JSONL records (records.py) prepared into a token store (prepare.py,
store_writer.py) that every process reads in place (store.py), the samples a run takes from a
store, a JSONL file or the target itself (sources.py), the batch order over them (order.py),
and the command line (cli.py, `python -m dflash.data`)."""

from dflash.data.sources import (
    SELF_GENERATED,
    Sample,
    open_data,
    random_prompts,
    sample_store,
    self_generated,
)

__all__ = [
    "SELF_GENERATED",
    "Sample",
    "open_data",
    "random_prompts",
    "sample_store",
    "self_generated",
]
