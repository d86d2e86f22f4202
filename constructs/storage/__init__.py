"""Storage: the data bucket, FSx for Lustre linked to it, and the one construct that grants access to its prefixes."""
