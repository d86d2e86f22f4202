"""Network: the VPC built for EFA (one training subnet in the file system's zone, endpoints, flow logs)."""
