"""The training image's dependency rule (training_image/efa_training/__init__.py), read from the imports themselves:
the runtime imports no workload and no checkpoint code (the launcher's choice of runner goes through the workloads'
registry, workloads/__init__.py), the checkpoint library imports only the runtime, and a workload imports the runtime,
the checkpoint library and the train command's settings, never another workload."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "training_image" / "efa_training"


def _layer(module: str) -> str:
    """runtime, checkpointing, workloads (the registry), workloads.<name>, or the module itself (an entry point)."""
    parts = module.split(".") + [""]
    if parts[1] == "workloads" and len(parts) > 3:
        return f"workloads.{parts[2]}"
    return parts[1] if parts[1] in ("runtime", "checkpointing", "workloads") else module


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("efa_training.")}
        elif isinstance(node, ast.ImportFrom) and (module := node.module or "").startswith("efa_training"):
            names = [f"{module}.{alias.name}" for alias in node.names]
            found |= set(names) if module == "efa_training" else {module}
    return found


def test_every_import_between_the_layers_goes_the_one_way():
    allowed = {
        "runtime": {"runtime"},
        "checkpointing": {"runtime", "checkpointing"},
        **{
            f"workloads.{w.name}": {"runtime", "checkpointing", f"workloads.{w.name}", "efa_training.train_config"}
            for w in (PACKAGE / "workloads").iterdir()
            if (w / "__init__.py").exists()
        },
    }
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("efa_training", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        own = _layer(module)
        for imported in _imports(path):
            ok = own not in allowed or _layer(imported) in allowed[own] or imported in allowed[own]
            ok = ok or (module == "efa_training.runtime.launch.command" and imported == "efa_training.workloads")
            if not ok:
                wrong.append(f"{module} imports {imported}")
    assert not wrong, wrong
    assert len(allowed) == 4  # runtime, checkpointing and the two workloads: gpt, ctr_ps
