"""efa_proof.EfaEvidence alone: what the sanity check accepts as EFA devices where the count is confirmed (EC2's, on
Batch and EKS) and where it is not (SageMaker documents no count per ml. type)."""

from config import CATALOGUE
from contracts.job_environment import job_environment
from efa_training.runtime.sanity import efa_proof

EFA = efa_proof.Transport("efa", "Libfabric", "efa", "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)")


def _evidence(devices: int, *, confirmed: bool) -> efa_proof.EfaEvidence:
    names = [f"uverbs{i}" for i in range(devices)]
    domains = [f"rdmap{i}s0-rdm" for i in range(devices)]
    return efa_proof.EfaEvidence(32, names, domains, None, EFA, count_confirmed=confirmed)


def test_a_confirmed_count_must_be_met_exactly():
    assert _evidence(32, confirmed=True).failures() == []
    uverbs, libfabric = _evidence(16, confirmed=True).failures()
    assert uverbs.startswith("EFA devices: 16 of 32") and "offers 16 of 32" in libfabric


def test_an_unconfirmed_count_wants_efa_devices_and_reports_what_it_found():
    # SageMaker: 16 EFA devices with EFA transport pass, and the report says to record the count; none fails.
    evidence = _evidence(16, confirmed=False)
    assert evidence.failures() == []
    (note,) = evidence.report()["notes"]
    assert "16 found where EC2 documents 32" in note
    uverbs, libfabric = _evidence(0, confirmed=False).failures()
    assert uverbs.startswith("EFA devices: 0 of 1") and "offers 0 of 1" in libfabric


def test_sagemaker_jobs_do_not_enforce_ec2s_count_until_it_is_measured():
    p5 = CATALOGUE["p5.48xlarge"]
    assert p5.sagemaker_efa_interfaces is None
    sagemaker = job_environment(p5, backend="sagemaker")
    assert (sagemaker["EFA_INTERFACES"], sagemaker["EFA_COUNT_CONFIRMED"]) == ("32", "0")
    batch = job_environment(p5, backend="batch")
    assert batch["EFA_INTERFACES"] == "32" and "EFA_COUNT_CONFIRMED" not in batch
