"""What the observability tests read: the dashboard's body, the alarms by name, one construct's bare stack."""

import json

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
