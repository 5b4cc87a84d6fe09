"""The code the compile caches are keyed by: the files the compiled drafter step is traced from,
the files that call torch.compile (its options shape every graph; dflash/target.py compiles the
target's decoder layers, whose code is transformers'), and any file that patches torch
internals (Inductor's own cache keys cannot see a patch).

The toolkit names a release's compile cache folder after the content of these files, with
torch, Triton, CUDA, the driver and the GPU model (module_utils/dflash_compile_cache.py): a
release that changes none of them starts on the previous release's cache, and inside it
Inductor and Triton keep their own content keys. The toolkit reads FILES from the release's
copy of this file without importing it, so keep it one literal tuple of "dflash/..." paths.
tests/trainer/test_compiled_files.py keeps the list true: every dflash file Dynamo traces, every
module those import, and every file that assigns into torch must be named here.
"""

FILES = (
    "dflash/mask.py",
    "dflash/model.py",
    "dflash/objective.py",
    "dflash/step.py",
    "dflash/target.py",
)
