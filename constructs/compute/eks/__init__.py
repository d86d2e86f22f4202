"""Amazon EKS: the cluster, the accelerator node group, the training workspace, the job runner and node scaling."""
