"""The instance catalogue's facts against the AWS sources they come from, and docs/configuration.md's table against
it."""

import re
from pathlib import Path

import botocore.session
import pytest

from config.catalogue import CATALOGUE, Accelerator, InstanceType
from tools.catalogue_table import table

ROOT = Path(__file__).resolve().parent.parent

# EKS user guide, "Use EKS-optimized accelerated AMIs for GPU instances" (ml-eks-optimized-ami): the families each
# accelerated AMI type supports, as the guide's table lists them.
EKS_AMI_FAMILIES = {
    "AL2023_X86_64_NVIDIA": {"p6-b300", "p6-b200", "p5", "p5e", "p5en", "p4d", "p4de", "p3", "p3dn", "g6", "g6e", "g5"},
    "AL2023_X86_64_NEURON": {"inf1", "inf2", "trn1", "trn2"},
}
# Batch API, Ec2Configuration.imageType: "ECS_AL2023_NVIDIA doesn't support p3 and g3 instance types."
BATCH_NVIDIA_EXCLUDED = {"p3", "g3"}


def _family(name: str) -> str:
    family = name.split(".")[0]
    return "trn1" if family == "trn1n" else family  # trn1n is a trn1 variant (the EKS table names trn1 only)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_each_type_runs_the_eks_accelerated_ami_the_guide_lists_it_under(name):
    instance = CATALOGUE[name]
    assert _family(name) in EKS_AMI_FAMILIES[instance.eks_ami_type]


def _of(accelerator: Accelerator) -> list[str]:
    return sorted(n for n, it in CATALOGUE.items() if it.accelerator is accelerator)


@pytest.mark.parametrize("name", _of(Accelerator.NVIDIA))
def test_gpu_types_are_ones_batchs_nvidia_image_supports(name):
    assert CATALOGUE[name].batch_image_type == "ECS_AL2023_NVIDIA" and _family(name) not in BATCH_NVIDIA_EXCLUDED


@pytest.mark.parametrize("name", _of(Accelerator.NEURON))
def test_neuron_types_take_batchs_plain_image_type_and_their_ami_from_the_launch_template(name):
    # Batch has no Neuron image type (Ec2Configuration.imageType); the launch template names the Neuron AMI.
    assert CATALOGUE[name].batch_image_type == "ECS_AL2023"


def test_sagemaker_offers_exactly_the_types_its_api_accepts():
    # CreateTrainingJob ResourceConfig.InstanceType: botocore's TrainingInstanceType enum (the API model).
    model = botocore.session.get_session().get_service_model("sagemaker")
    accepted = set(model.shape_for("TrainingInstanceType").enum)
    for it in CATALOGUE.values():
        assert it.sagemaker_offered == (it.sagemaker_instance_type in accepted), it.name


def test_every_catalogue_type_is_an_ec2_instance_type():
    model = botocore.session.get_session().get_service_model("ec2")
    assert set(CATALOGUE) <= set(model.shape_for("InstanceType").enum)


def test_a_type_with_more_efa_interfaces_than_network_cards_is_refused():
    # One EFA interface per network card (EC2 user guide, "Maximize network bandwidth ... multiple network cards").
    p5en = CATALOGUE["p5en.48xlarge"]
    with pytest.raises(ValueError, match="17 EFA interfaces on 16 network cards"):
        InstanceType(**{**p5en.__dict__, "efa_interfaces": 17})


def test_a_type_without_its_per_card_interface_limit_is_refused():
    # NetworkCardInfo.MaximumNetworkInterfaces (EC2 API reference) bounds every launch-template layout; none is guessed.
    p5 = CATALOGUE["p5.48xlarge"]
    with pytest.raises(ValueError, match="max_interfaces_per_network_card=0 is not valid"):
        InstanceType(**{**p5.__dict__, "max_interfaces_per_network_card": 0})


def test_types_without_an_on_demand_price_say_why():
    for it in CATALOGUE.values():
        assert (it.on_demand_usd_per_hour is None) <= bool(it.price_note), it.name


@pytest.mark.parametrize(
    "name", sorted(n for n, it in CATALOGUE.items() if it.sagemaker_price_estimated and it.on_demand_usd_per_hour)
)
def test_sagemaker_estimates_follow_the_ec2_price(name):
    it = CATALOGUE[name]
    assert it.sagemaker_usd_per_hour == pytest.approx(it.on_demand_usd_per_hour * 1.15, abs=1e-4)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_each_accelerators_memory_is_the_one_its_model_names(name):
    # GPUs: the memory in the model's name (NVIDIA's figure, as EC2 lists it). Trainium: EC2's accelerator memory
    # over the chips, 512 GB over 16 on trn1 and trn1n, 1.5 TB over 16 on trn2 (EC2 accelerated computing specs).
    it = CATALOGUE[name]
    if it.accelerator is Accelerator.NVIDIA:
        assert f" {it.accelerator_memory_gb:g} GB" in it.accelerator_model
    else:
        assert it.accelerator_memory_gb == (96 if it.accelerator_model.startswith("Trainium2") else 32)


def test_readme_catalogue_table_is_the_catalogues():
    readme = (ROOT / "docs" / "configuration.md").read_text()  # moved from README.md
    block = re.search(r"<!-- catalogue-table:start -->\n(.*?)\n<!-- catalogue-table:end -->", readme, re.S)
    assert block is not None and block.group(1) == table()
