"""Typed configuration (one module) and the instance catalogue (one module), read by every stack."""

from config.catalogue import BUSBW_MESSAGE_BYTES, CATALOGUE, Accelerator, InstanceType, efa_instance_types
from config.environment import ConfigError, EnvironmentConfig, load_config

__all__ = [
    "BUSBW_MESSAGE_BYTES",
    "CATALOGUE",
    "Accelerator",
    "ConfigError",
    "EnvironmentConfig",
    "InstanceType",
    "efa_instance_types",
    "load_config",
]
