"""The Step Functions pipeline: input checks, run claim, jobs, verdict and the failure path."""
