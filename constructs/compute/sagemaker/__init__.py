"""SageMaker compute backend: the training jobs' execution role and the pipeline's job runner."""
