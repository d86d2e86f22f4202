"""The two gates every synthesized app passes, in one place: `make synth` prints them, the tests assert them.

cdk-nag (AwsSolutions) runs inside synth and writes validation-report.json; cfn-lint checks every template.
"""

import json
from pathlib import Path

from cfnlint.api import ManualArgs, lint_by_config
from cfnlint.match import Match

# The app's own warnings (Annotations ids "efa-training:...", e.g. the budget left out where a region has no
# AWS::Budgets::Budget) tell the user something; the report lists them and they are no finding to acknowledge.
APP_WARNING = "Annotation::efa-training:"


def open_findings(outdir: Path) -> tuple[list[str], int]:
    """cdk-nag (and CDK's own template checks): the findings nobody acknowledged, and how many were acknowledged."""
    report = json.loads((outdir / "validation-report.json").read_text())
    violations = [
        (plugin["pluginName"], v)
        for plugin in report["pluginReports"]
        for v in plugin.get("violations", [])
        if not str(v.get("ruleName", "")).startswith(APP_WARNING)
    ]
    unacknowledged = [f"{name}: {v.get('ruleName')}" for name, v in violations if not v.get("acknowledgedId")]
    return unacknowledged, len(violations) - len(unacknowledged)


def cfn_lint(outdir: Path, region: str | None) -> tuple[list[Match], list[Match]]:
    """cfn-lint over every template of the cloud assembly: (errors, warnings); errors fail the gate."""
    regions = [region] if region and region != "unknown-region" else None
    templates = [str(template) for template in sorted(outdir.glob("*.template.json"))]
    # One run over every template: cfn-lint loads its rules and their data once, not once per template.
    matches = lint_by_config(ManualArgs(templates=templates, regions=regions)) if templates else []
    errors = [m for m in matches if m.rule.id.startswith("E")]
    return errors, [m for m in matches if not m.rule.id.startswith("E")]
