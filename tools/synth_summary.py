"""Print what `make synth` produced: stacks, resource counts, and the cdk-nag and cfn-lint gate results."""

import json
import sys
from collections import Counter
from pathlib import Path

from tools.gates import cfn_lint, open_findings, stack_templates


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

    unacknowledged, acknowledged = open_findings(root)
    print(
        f"cdk-nag AwsSolutions: {'passed' if not unacknowledged else 'FAILED'} "
        f"({len(unacknowledged)} open, {acknowledged} acknowledged in the report)"
    )
    region = next(iter(stacks.values()))["environment"].rsplit("/", 1)[-1]
    errors, warnings = cfn_lint(root, region)
    print(
        f"cfn-lint: {'passed' if not errors else 'FAILED'} ({len(errors)} errors, {len(warnings)} "
        f"warnings over {len(stack_templates(root))} templates)"
    )
    for match in errors:
        print(f"  {match}")
    return 1 if errors or unacknowledged else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
