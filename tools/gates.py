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
    """cdk-nag (and CDK's own template checks): the findings nobody acknowledged, and how many were acknowledged
    (the report lists those apart, as each plugin's `suppressedViolations`)."""
    report = json.loads((outdir / "validation-report.json").read_text())

    def findings(key: str) -> list[tuple[str, dict]]:
        return [
            (plugin["pluginName"], v)
            for plugin in report["pluginReports"]
            for v in plugin.get(key, [])
            if not str(v.get("ruleName", "")).startswith(APP_WARNING)
        ]

    open_ = [f"{name}: {v.get('ruleName')}" for name, v in findings("violations") if not v.get("acknowledgedId")]
    return open_, len(findings("suppressedViolations"))


def stack_templates(outdir: Path) -> list[Path]:
    """The templates of the synthesis in `outdir`, from its manifest: not every *.template.json a previous
    synthesis of another environment left there. A folder without a manifest is a folder of templates."""
    if not (outdir / "manifest.json").exists():
        return sorted(outdir.glob("*.template.json"))
    manifest = json.loads((outdir / "manifest.json").read_text())
    artifacts = manifest["artifacts"].values()
    return [outdir / a["properties"]["templateFile"] for a in artifacts if a["type"] == "aws:cloudformation:stack"]


def cfn_lint(outdir: Path, region: str | None) -> tuple[list[Match], list[Match]]:
    """cfn-lint over every template of the cloud assembly: (errors, warnings); errors fail the gate."""
    regions = [region] if region and region != "unknown-region" else None
    templates = [str(template) for template in sorted(stack_templates(outdir))]
    # One run over every template: cfn-lint loads its rules and their data once, not once per template.
    matches = lint_by_config(ManualArgs(templates=templates, regions=regions)) if templates else []
    errors = [m for m in matches if m.rule.id.startswith("E")]
    return errors, [m for m in matches if not m.rule.id.startswith("E")]
