"""distributed.py: which device `--device auto` means, for the scripts that support each device."""

import pytest

from efa_training.runtime import distributed
from efa_training.runtime.errors import UsageError


def test_neuron_node_without_torch_xla_is_a_usage_error(monkeypatch):
    # ACCELERATOR_KIND=neuron in an image without torch_xla: one line naming the cause, no ImportError.
    monkeypatch.setenv("ACCELERATOR_KIND", "neuron")
    monkeypatch.setattr(distributed.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="torch_xla .* not installed"):
        distributed.resolve_device("auto")


def test_auto_follows_the_accelerator_kind(monkeypatch):
    monkeypatch.setenv("ACCELERATOR_KIND", "gpu")
    assert distributed.resolve_device("auto") == "cuda"
    monkeypatch.setenv("ACCELERATOR_KIND", "cpu")
    assert distributed.resolve_device("auto") == "cpu"


def test_a_script_without_an_xla_path_evaluates_a_neuron_node_on_cpu(monkeypatch):
    # validate.py is fp32 on one device with no XLA path: on a Neuron node (no CUDA) auto is the CPU.
    monkeypatch.setenv("ACCELERATOR_KIND", "neuron")
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: False)
    assert distributed.resolve_device("auto", ("auto", "cuda", "cpu")) == "cpu"


def test_a_device_the_script_does_not_support_is_one_usage_error():
    with pytest.raises(UsageError, match=r"--device='xla': unknown device; allowed: auto, cuda, cpu"):
        distributed.resolve_device("xla", ("auto", "cuda", "cpu"))


def test_an_unknown_accelerator_kind_is_one_usage_error(monkeypatch):
    monkeypatch.setenv("ACCELERATOR_KIND", "tpu")
    with pytest.raises(UsageError, match="ACCELERATOR_KIND='tpu': unknown accelerator kind"):
        distributed.resolve_device("auto")
