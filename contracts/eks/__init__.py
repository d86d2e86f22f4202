"""Kubernetes manifests of the training jobs as plain dictionaries (no CDK).

Read by the EKS constructs and by k8s/render.py.
"""
