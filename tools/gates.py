"""The gates every synthesized app passes, in one place: `make synth` prints them, the tests assert them.

cdk-nag (AwsSolutions) runs inside synth and writes validation-report.json; cfn-lint checks every template; checkov,
an IaC scanner independent of both, checks them again (in its own environment: its pins conflict with .venv's).
"""

import json
import subprocess
from pathlib import Path

from cfnlint.api import ManualArgs, lint_by_config
from cfnlint.match import Match

ROOT = Path(__file__).resolve().parent.parent
# checkov pins boto3, packaging and networkx below .venv's (moto, cfn-lint): `make setup` gives it .venv-scan.
CHECKOV = ROOT / ".venv-scan" / "bin" / "checkov"

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


def checkov(templates: list[Path]) -> list[str]:
    """checkov's CloudFormation checks over these templates: the failures nobody acknowledged, one line each
    ("<template>: <check id> <type>.<logical id>"); a resource's Metadata.checkov.skip acknowledges (constructs/nag.py).
    --skip-download: nothing is fetched from checkov's platform, so it runs offline and the same everywhere."""
    if not templates:
        return []
    if not CHECKOV.exists():
        raise FileNotFoundError(f"{CHECKOV} is missing: run `make setup` (it installs requirements-scan.txt)")
    files = [argument for template in templates for argument in ("--file", str(template))]
    options = ["--framework", "cloudformation", "--skip-download", "--quiet", "--compact", "--output", "json"]
    done = subprocess.run([str(CHECKOV), *options, *files], capture_output=True, text=True, check=False)
    try:
        reports = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"checkov failed (exit {done.returncode}): {done.stderr[-2000:]}") from None
    return [
        f"{Path(failed['file_path']).name}: {failed['check_id']} {failed['resource']}"
        for report in (reports if isinstance(reports, list) else [reports])
        for failed in report.get("results", {}).get("failed_checks", [])
    ]
