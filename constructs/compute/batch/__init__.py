"""AWS Batch: multi-node parallel job definitions, host user data and the pipeline's Batch job runner."""
