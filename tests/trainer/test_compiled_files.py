"""dflash/compiled.py names every file the compile cache must be keyed by: the files Dynamo
traces when it compiles the drafter step, the modules those import, and any file that patches
torch. A file missing from the list would let a release that changes it start on a cache
compiled from the old code."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import torch

from dflash import compiled
from dflash.config import StepConfig
from dflash.options import build_drafter, drafter_config, fixed_rows, gamma
from dflash.pipeline import FeatureBatch
from dflash.step import DrafterStep
from dflash.target import load_target_config
from dflash.warmup import build_parser

PACKAGE = Path(compiled.__file__).resolve().parent
# Traced only on a GPU (flex_attention's block mask), which the CPU trace below cannot reach.
TRACED_ON_GPU_ONLY = {"dflash/mask.py"}


def package_path(filename: str) -> str | None:
    path = Path(filename).resolve()
    if not path.is_relative_to(PACKAGE):
        return None
    return f"dflash/{path.relative_to(PACKAGE).as_posix()}"


def traced_files() -> set[str]:
    """The dflash files in the stack traces of every graph Dynamo captures from the drafter
    step's compiled forward (a backend that records them and runs the graph as it is)."""
    seen: set[str] = set()

    def recording_backend(graph: torch.fx.GraphModule, _inputs: list) -> object:
        for node in graph.graph.nodes:
            for filename in re.findall(r'File "([^"]+)"', node.meta.get("stack_trace") or ""):
                if path := package_path(filename):
                    seen.add(path)
        return graph.forward

    args = build_parser().parse_args(
        ["--drafter-layers", "1", "--max-seq-len", "32", "--token-budget", "64",
         "--num-anchors", "4", "--compile-drafter"]
    )  # fmt: skip
    config = StepConfig.from_args(args)
    cfg = drafter_config(config, load_target_config("tiny"), mask_token_id=0)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    drafter = build_drafter(cfg, embed, embed, torch.device("cpu"), seed=0)
    step = DrafterStep(drafter, gamma(config), config.num_anchors, compile=False)
    torch._dynamo.reset()
    step.forward = torch.compile(drafter, backend=recording_backend, dynamic=False)
    rows = fixed_rows(config, on_gpu=False)
    batch = FeatureBatch(
        input_ids=torch.randint(0, cfg.vocab_size, (rows, config.max_seq_len)),
        loss_mask=torch.ones(rows, config.max_seq_len, dtype=torch.bool),
        features=torch.randn(rows, config.max_seq_len, cfg.num_features * cfg.hidden_size),
        num_tokens=rows * config.max_seq_len,
    )
    step.loss(batch, torch.Generator().manual_seed(0)).backward()
    torch._dynamo.reset()
    return seen


def dflash_imports(path: str) -> set[str]:
    """The dflash modules a file imports, as package paths."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE.parent / path).read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            candidate = name.replace(".", "/") + ".py"
            if name.startswith("dflash.") and (PACKAGE.parent / candidate).is_file():
                found.add(candidate)
    return found


def patches_torch(source: str) -> bool:
    """Whether a module assigns into torch: `torch.x.y = ...`, `setattr(torch..., ...)`, or an
    assignment through a name imported from torch (`from torch._inductor import config`)."""
    tree = ast.parse(source)
    from_torch = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch"
        for alias in node.names
    } | {"torch"}

    def rooted_in_torch(expr: ast.expr) -> bool:
        while isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        return isinstance(expr, ast.Name) and expr.id in from_torch

    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr":
            targets = node.args[:1]
        if any(
            isinstance(t, (ast.Attribute, ast.Subscript)) and rooted_in_torch(t) for t in targets
        ):
            return True
    return False


def test_every_traced_file_is_listed():
    traced = traced_files()
    assert "dflash/model.py" in traced, f"the recording backend saw no drafter code: {traced}"
    assert traced <= set(compiled.FILES), f"traced but not in dflash/compiled.py: {traced}"


def test_every_module_the_traced_files_import_is_listed():
    for path in (traced_files() | TRACED_ON_GPU_ONLY) & set(compiled.FILES):
        missing = dflash_imports(path) - set(compiled.FILES)
        assert not missing, f"{path} imports {missing}, which dflash/compiled.py does not list"


def package_files(test: Callable[[str], bool]) -> set[str]:
    """The dflash files whose source passes `test`, as package paths."""
    return {
        f"dflash/{p.relative_to(PACKAGE).as_posix()}"
        for p in PACKAGE.rglob("*.py")
        if test(p.read_text())
    }


def test_every_file_that_patches_torch_is_listed():
    assert patches_torch("import torch\ntorch._inductor.config.fx_graph_cache = False\n")
    assert patches_torch("from torch._dynamo import config\nconfig.cache_size_limit += 8\n")
    assert patches_torch("import torch\nsetattr(torch.nn.functional, 'gelu', None)\n")
    assert not patches_torch("import torch\nx = torch.ones(2)\nx[0] = 1\n")
    patching = package_files(patches_torch)
    assert patching <= set(compiled.FILES), f"patch torch, not listed: {patching}"


def calls_torch_compile(source: str) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "compile"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "torch"
        for node in ast.walk(ast.parse(source))
    )


def test_every_file_that_calls_torch_compile_is_listed():
    assert calls_torch_compile("import torch\nf = torch.compile(g, dynamic=False)\n")
    assert not calls_torch_compile("import re\nre.compile('x')\n")
    compiling = package_files(calls_torch_compile)
    assert "dflash/target.py" in compiling
    assert compiling <= set(compiled.FILES), f"call torch.compile, not listed: {compiling}"
