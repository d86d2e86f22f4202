"""What the backends share: the EFA launch template of the accelerator hosts."""
