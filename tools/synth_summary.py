"""Print what `make synth` produced: stacks, resource counts, and the cdk-nag and cfn-lint gate results."""

import json
import sys
from collections import Counter
from pathlib import Path

from cfnlint.api import ManualArgs, lint_file


def main(outdir: str = "cdk.out") -> int:
    root = Path(outdir)
    manifest = json.loads((root / "manifest.json").read_text())
    stacks = {name: a for name, a in manifest["artifacts"].items() if a["type"] == "aws:cloudformation:stack"}
    print(f"Synthesized {len(stacks)} stacks into {root}/")
    total = 0
    for name, artifact in stacks.items():
        template = json.loads((root / artifact["properties"]["templateFile"]).read_text())
        kinds = Counter(resource["Type"] for resource in template.get("Resources", {}).values())
        total += sum(kinds.values())
        top = ", ".join(f"{kind.split('::', 1)[1]} {n}" for kind, n in kinds.most_common(4))
        print(f"  {name:<36} {sum(kinds.values()):>4} resources  ({top})")
    print(f"  {'total':<36} {total:>4} resources")

    report = json.loads((root / "validation-report.json").read_text())
    violations = [v for plugin in report["pluginReports"] for v in plugin.get("violations", [])]
    open_findings = [v for v in violations if not v.get("acknowledgedId")]
    print(f"cdk-nag AwsSolutions: {'passed' if not open_findings else 'FAILED'} "
          f"({len(open_findings)} open, {len(violations) - len(open_findings)} acknowledged in the report)")

    region = next(iter(stacks.values()))["environment"].rsplit("/", 1)[-1]
    matches = [m for template in sorted(root.glob("*.template.json"))
               for m in lint_file(template, ManualArgs(regions=[region] if region != "unknown-region" else None))]
    errors = [m for m in matches if m.rule.id.startswith("E")]
    print(f"cfn-lint: {'passed' if not errors else 'FAILED'} ({len(errors)} errors, {len(matches) - len(errors)} "
          f"warnings over {len(list(root.glob('*.template.json')))} templates)")
    for match in errors:
        print(f"  {match}")
    return 1 if errors or open_findings else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
