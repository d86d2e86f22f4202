"""Kubernetes manifests of the training jobs as plain dictionaries (no CDK): read by the EKS constructs and k8s/render.py."""
