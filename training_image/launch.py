"""The image's entry point, `python /opt/training/launch.py {sanity|train|compile|validate|prepare-data} [args...]`:
the job definitions, pod specs and SageMaker's ContainerEntrypoint name this file. The launcher itself is
efa_training/runtime/launch/ (`launch.py --help` prints its manual)."""

import sys

from efa_training.runtime.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
