"""`python -m efa_training.runtime.sanity [flags]`: the sanity check (cli.py), as the launcher's torchrun workers run
it."""

from efa_training.runtime.errors import exit_process
from efa_training.runtime.sanity.cli import main

if __name__ == "__main__":
    exit_process(main())
