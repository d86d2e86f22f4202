"""The launcher: `launch.py MODE [args...]` in the container, from the scheduler's environment to the processes.

cli.py             main: the manual (--help), --version, the dry run, the first log line
modes.py           what each mode runs (`python -m` entry points), and where the package is for the children
rendezvous.py      LaunchPlan: torchrun's rendezvous from AWS Batch, Kubernetes or SageMaker (a pure function)
sagemaker.py       SageMaker's files: resourceconfig.json, hyperparameters.json, the failure file
command.py         the command and environment for a mode (torchrun, the workload's supervisor, or one process)
process.py         the children, with stop signals passed on, ending with the workers' own exit code
neuron_compile.py  Trainium's ahead-of-time compilation: the trial run, the cache, the run shape's ready marker
"""
