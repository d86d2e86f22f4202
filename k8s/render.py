#!/usr/bin/env python3
"""Print a job for one phase as JSON (kubectl accepts it).

    python k8s/render.py train --image URI | kubectl create -f -


The same objects the stack stores in the cluster (ConfigMap training/job-templates), for any catalogue type.
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Importing `constructs` starts jsii's Node.js: use the project's pinned Node 22, as app.py does.
if (ROOT / "node_modules" / ".bin" / "node").exists():
    os.environ.setdefault("JSII_NODE", str(ROOT / "node_modules" / ".bin" / "node"))

from config import CATALOGUE, efa_instance_types  # noqa: E402
from contracts.eks.job_spec import FSX_CLAIM, PHASES, Site  # noqa: E402
from contracts.eks.job_templates import indexed_job, train_job, training_runtime  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=(*PHASES, "runtime"))
    parser.add_argument("--instance-type", default="p5.48xlarge", choices=efa_instance_types())
    parser.add_argument("--image", required=True, help="training image URI (the Registry stack's output)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--fsx-claim",
        default=FSX_CLAIM,
        help="the file system's claim: the Eks stack's FsxClaimName output (default %(default)s)",
    )
    parser.add_argument(
        "--environment", default="", help="the environment's name, the Environment dimension of the training metrics"
    )
    parser.add_argument("--name", help="job name (default efa-<phase>)")
    parser.add_argument(
        "--kind",
        choices=("trainjob", "job"),
        default="trainjob",
        help="Kubeflow TrainJob, or the batch/v1 Indexed Job the pipeline runs",
    )
    parser.add_argument("args", nargs="*", help="launcher flags after the phase, e.g. -- --max-steps 100")
    options = parser.parse_args(argv)
    instance = CATALOGUE[options.instance_type]
    site = Site(environment=options.environment, fsx_claim=options.fsx_claim)
    if options.phase == "runtime":
        obj = training_runtime(instance, image=options.image, nodes=options.nodes, site=site)
    elif options.kind == "job":
        obj = indexed_job(
            instance,
            image=options.image,
            phase=options.phase,
            nodes=options.nodes,
            name=options.name or f"efa-{options.phase}",
            args=options.args,
            site=site,
        )
    else:
        obj = train_job(
            instance,
            image=options.image,
            phase=options.phase,
            nodes=options.nodes,
            name=options.name,
            args=options.args,
            site=site,
        )
    json.dump(obj, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
