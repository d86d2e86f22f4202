"""The image's fallback table of accelerator peaks against config/catalogue.py, the one catalogue of instance facts.

The jobs of a deployed environment get PEAK_TFLOPS_PER_ACCELERATOR from the catalogue; the image's own table
(metrics.PEAK_BF16_TFLOPS) serves hand runs and must give the same figure for every catalogued accelerator.
"""

import pytest

from config.catalogue import CATALOGUE
from efa_training.runtime import metrics


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_image_peak_of_each_catalogued_accelerator_is_the_catalogues(name, monkeypatch):
    monkeypatch.delenv("PEAK_TFLOPS_PER_ACCELERATOR", raising=False)
    instance = CATALOGUE[name]
    assert metrics.peak_tflops(instance.accelerator_model) == instance.peak_bf16_tflops_per_accelerator


def test_the_jobs_peak_takes_precedence_over_the_table(monkeypatch):
    # Set by both backends from the catalogue (the job environment): the figure MFU is computed with.
    monkeypatch.setenv("PEAK_TFLOPS_PER_ACCELERATOR", "123.5")
    assert metrics.peak_tflops("NVIDIA H100 80GB HBM3") == 123.5
