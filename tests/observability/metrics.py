"""What the observability tests read: the dashboard's body, the alarms by name, the training image's modules."""

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from aws_cdk.assertions import Template

from config import CATALOGUE, Accelerator

NVIDIA = next(name for name, it in CATALOGUE.items() if it.accelerator is Accelerator.NVIDIA and it.has_efa)
NEURON = next(name for name, it in CATALOGUE.items() if it.accelerator is Accelerator.NEURON and it.has_efa)


def body(template: Template) -> str:
    """The dashboard body with its CloudFormation joins flattened into one searchable string."""
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    return json.dumps(dashboard["Properties"]["DashboardBody"])


def alarms(template: Template) -> dict[str, dict]:
    return {
        res["Properties"]["AlarmName"]: res["Properties"]
        for res in template.find_resources("AWS::CloudWatch::Alarm").values()
    }


def training_image_module(name: str) -> ModuleType:
    """training_image/efa_training/runtime/<name>.py (metrics or host_metrics: standard library only), loaded by its
    path under a name of its own: pytest puts this folder, whose metrics.py is this file, first on sys.path."""
    qualified = f"training_image_{name}"
    if qualified not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "training_image" / "efa_training" / "runtime" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(qualified, path)
        assert spec and spec.loader
        sys.modules[qualified] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[qualified]
