"""Where things live: the FSx mount on every node and the S3 prefixes the data repository links to.

The file system's root is linked to the bucket's root, so /fsx/<prefix> and s3://<bucket>/<prefix> hold the same files.
"""

FSX_MOUNT_PATH = "/fsx"
DATASETS_PREFIX = "datasets/"
CHECKPOINTS_PREFIX = "checkpoints/"
MODELS_PREFIX = "models/"
RUNS_PREFIX = "runs/"  # per-run reports: sanity check, verdicts, summaries
