"""Configuration: every bad value stops the app with one line naming the field, the value and what is allowed."""

import json
import os
import subprocess
import sys

import pytest

from app import build_app
from config import CATALOGUE, ConfigError, efa_instance_types, load_config
from config.capacity import KINDS, CapacityReservation
from config.environment import MAX_NODES
from tests.synthesis import CDK_JSON_CONTEXT, ROOT, instance_variant

_DDP = json.dumps({"torch-ddp": json.loads((ROOT / "examples/torch_ddp/workload.json").read_text())})
BAD_INPUTS = [
    # (overrides, words the one-line message must contain)
    ({"env": "staging"}, ["env='staging'", "dev", "prod"]),
    ({"colour": "blue"}, ["unknown field 'colour'"]),
    ({"compute": "slurm"}, ["compute='slurm'", "batch or eks or sagemaker"]),
    ({"sagemaker_data_source": "efs"}, ["sagemaker_data_source='efs'", "fsx or s3"]),
    ({"sagemaker_spot": "sometimes"}, ["sagemaker_spot='sometimes'", "true or false"]),
    (
        {"compute": "sagemaker", "instance_type": "trn1.32xlarge", "sagemaker_data_source": "s3"},
        ["sagemaker_data_source='s3'", "fsx with trn1.32xlarge on SageMaker"],
    ),
    ({"instance_type": "p3.2xlarge"}, ["instance_type='p3.2xlarge'", "p5.48xlarge"]),
    ({"instance_type": "g5.xlarge"}, ["instance_type='g5.xlarge'", "no EFA"]),
    ({"nodes": "0"}, ["nodes=0", f"1 to {MAX_NODES}"]),
    ({"nodes": str(MAX_NODES + 1)}, [f"nodes={MAX_NODES + 1}", f"1 to {MAX_NODES}"]),
    ({"nodes": "two"}, ["nodes='two'", "an integer"]),
    ({"fsx_storage_gib": "1000"}, ["fsx_storage_gib=1000", "multiple of 2400"]),
    ({"fsx_storage_gib": "3600"}, ["fsx_storage_gib=3600", "multiple of 2400"]),
    ({"fsx_throughput_per_tib": "300"}, ["fsx_throughput_per_tib=300", "125, 250, 500, 1000"]),
    ({"fsx_deployment_type": "PERSISTENT_1"}, ["fsx_deployment_type='PERSISTENT_1'", "PERSISTENT_2 or SCRATCH_2"]),
    ({"budget_monthly_usd": "0"}, ["budget_monthly_usd=0.0", "positive"]),
    ({"budget_monthly_usd": "-5"}, ["budget_monthly_usd=-5.0", "positive"]),
    ({"budget_monthly_usd": "lots"}, ["budget_monthly_usd='lots'", "a number"]),
    ({"alert_emails": "ops@example.com,not-an-email"}, ["alert_emails='not-an-email'", "e-mail"]),
    ({"region": "useast1"}, ["region='useast1'", "us-east-1"]),
    ({"region": "us-east-1", "availability_zone": "us-west-2a"}, ["availability_zone='us-west-2a'", "us-east-1a"]),
    ({"availability_zone": "us-east-1-a"}, ["availability_zone='us-east-1-a'"]),
    ({"retain_data": "maybe"}, ["retain_data='maybe'", "true or false"]),
    ({"log_retention_days": "10"}, ["log_retention_days=10", "14"]),
    ({"account": "12345"}, ["account='12345'", "12 digits"]),
    ({"vpc_cidr": "192.168.0.0/16"}, ["vpc_cidr='192.168.0.0/16'", "10.0.0.0/16"]),
    ({"capacity_wait_hours": "-1"}, ["capacity_wait_hours=-1", "from 0 (fail at the first shortage) to 168"]),
    ({"capacity_wait_hours": "169"}, ["capacity_wait_hours=169", "to 168"]),
    # A longer wait than the pipeline's stage timeouts allow each submission would end in States.Timeout.
    ({"batch_capacity_wait_minutes": "61"}, ["batch_capacity_wait_minutes=61", "from 5 to 60"]),
    ({"batch_capacity_wait_minutes": "4"}, ["batch_capacity_wait_minutes=4", "from 5 to 60"]),
    # A Capacity Block moved from eks_capacity_type to capacity_reservation (0.4.0): the old words say where.
    ({"eks_capacity_type": "capacity_block"}, ["eks_capacity_type='capacity_block'", "is now capacity_reservation"]),
    (
        {"eks_capacity_reservation_id": "cr-0123456789abcdef0"},
        ["eks_capacity_reservation_id is now capacity_reservation"],
    ),
    # The Neuron compiler's flags reach the jobs' environment: no shell metacharacters, no stray words, no LNC (it
    # must match the runtime's: Neuron docs, "Logical NeuronCore configuration").
    ({"neuron_cc_flags": "-O1; rm -rf /"}, ["neuron_cc_flags='-O1; rm -rf /'", "neuronx-cc options"]),
    ({"neuron_cc_flags": "transformer"}, ["neuron_cc_flags='transformer'", "starting with '-'"]),
    ({"tracking_uri": "https://user:secret@mlflow.internal"}, ["tracking_uri=", "no user or password"]),
    ({"tracking_uri": "mlflow.internal:5000"}, ["tracking_uri='mlflow.internal:5000'", "http(s) URL"]),
    # CreateMlflowTrackingServer's sizes, lower-cased; one server or one URL, not both.
    ({"tracking_server": "Small"}, ["tracking_server='Small'", "small, medium or large"]),
    (
        {"tracking_server": "small", "tracking_uri": "https://mlflow.internal"},
        ["tracking_server='small'", "then no tracking_uri"],
    ),
    ({"neuron_cc_flags": ""}, ["neuron_cc_flags=''", "neuronx-cc options"]),
    ({"neuron_cc_flags": "-O1  --model-type=transformer"}, ["neuron_cc_flags='-O1  --model-type=transformer'"]),
    ({"neuron_cc_flags": "--logical-nc-config=1"}, ["neuron_cc_flags='--logical-nc-config=1'", "LOGICAL_NC"]),
    ({"neuron_cc_flags": "-lnc 1"}, ["neuron_cc_flags='-lnc 1'", "NEURON_LOGICAL_NC_CONFIG"]),
    ({"neuron_cc_flags": "-O\u0661"}, ["neuron_cc_flags="]),
    ({"neuron_cc_flags": "-O1 " + "-x " * 200}, ["neuron_cc_flags=", "at most 512"]),
    # Cost-allocation tags (Tagging AWS resources, "Tag naming limits and requirements"): Key=Value, no aws: prefix,
    # and not the two the app sets itself (the budget filters on Environment).
    ({"tags": "CostCenter"}, ["tags='CostCenter'", "Key=Value"]),
    ({"tags": "aws:owner=me"}, ["tags='aws:owner=me'", "not starting with aws:"]),
    ({"tags": "AWS:owner=me"}, ["tags='AWS:owner=me'", "not starting with aws:"]),
    ({"tags": "Environment=prod"}, ["tags='Environment'", "not Project or Environment"]),
    ({"tags": "Team=a,Team=b"}, ["tags='Team'", "each key once"]),
    ({"tags": "Team=" + "x" * 257}, ["tags=", "a value of at most 256"]),
    ({"noncurrent_version_days": "0"}, ["noncurrent_version_days=0", "1 to 3650"]),
    ({"eks_kubeflow_trainer": "perhaps"}, ["eks_kubeflow_trainer='perhaps'", "true or false"]),
    # EKS validates on a node group of one small node: an EFA type there would idle a whole training node.
    (
        {"compute": "eks", "batch_single_node_instance_type": "p4d.24xlarge"},
        ["batch_single_node_instance_type='p4d.24xlarge'", "single-accelerator catalogue type without EFA on EKS"],
    ),
    ({"compute": "eks", "batch_single_node_instance_type": "0"}, ["batch_single_node_instance_type='0'", "unset"]),
    ({"workloads": "[]"}, ["workloads='[]'", "a JSON object"]),
    # Declared workloads run on GPU instances in this release (docs/workloads.md, "Where it runs").
    ({"instance_type": "trn1.32xlarge", "workloads": _DDP}, ["workloads='torch-ddp'", "Trainium"]),
    ({"workloads": '{"gpt": {}}'}, ["workloads.gpt: the name is not valid", "other than gpt and ctr-ps"]),
]


@pytest.mark.parametrize(
    "overrides,expected", BAD_INPUTS, ids=[next(iter(o)) + "=" + str(list(o.values())[-1]) for o, _ in BAD_INPUTS]
)
def test_bad_value_is_refused_with_one_line_naming_field_value_and_allowed(overrides, expected):
    with pytest.raises(ConfigError) as refused:
        load_config({**CDK_JSON_CONTEXT, **overrides})
    message = str(refused.value)
    assert "\n" not in message
    for words in expected:
        assert words in message, message


def test_the_seeds_compiler_flags_and_a_users_own_are_accepted():
    assert (
        load_config(CDK_JSON_CONTEXT).neuron_cc_flags
        == "--model-type=transformer -O1 --auto-cast=matmult --auto-cast-type=bf16"
    )
    flags = "--model-type transformer --optlevel 2 --enable-mixed-precision-accumulation"
    assert load_config({**CDK_JSON_CONTEXT, "neuron_cc_flags": flags}).neuron_cc_flags == flags


def test_command_line_strings_are_coerced_to_field_types():
    config = load_config(
        {
            **CDK_JSON_CONTEXT,
            "nodes": "8",
            "budget_monthly_usd": "1500.5",
            "retain_data": "true",
            "alert_emails": "a@example.com, b@example.com",
            "availability_zone": "none",
        }
    )
    assert (config.nodes, config.budget_monthly_usd, config.retain_data) == (8, 1500.5, True)
    assert config.alert_emails == ("a@example.com", "b@example.com")
    assert config.availability_zone is None


def test_env_selects_a_named_environment_and_fields_override_it():
    config = load_config({**CDK_JSON_CONTEXT, "env": "prod", "instance_type": "trn1.32xlarge"})
    assert config.name == "prod"
    assert config.retain_data is True  # from cdk.json's prod
    assert config.instance_type == "trn1.32xlarge"  # from the override


def test_default_environment_is_dev():
    assert load_config({k: v for k, v in CDK_JSON_CONTEXT.items() if k != "env"}).name == "dev"


def test_catalogue_instance_types_with_efa_are_all_accepted():
    # On Batch, in a Capacity Block for the types EC2 sells through Capacity Blocks only (and on SageMaker, below).
    assert efa_instance_types()
    for name in efa_instance_types():
        overrides = instance_variant("batch", name) or instance_variant("eks", name)
        assert overrides is not None
        assert load_config({**CDK_JSON_CONTEXT, **overrides}).instance is CATALOGUE[name]


@pytest.mark.parametrize("name", [n for n in efa_instance_types() if CATALOGUE[n].capacity_blocks_only])
def test_a_capacity_blocks_only_type_is_refused_outside_a_capacity_block(name):
    # EC2 sells p5e and trn2 through Capacity Blocks for ML only: on demand, on Spot or in an On-Demand reservation the
    # jobs would wait for capacity that is never sold that way. One line each, at synth.
    on_demand = json.dumps({"kind": "on_demand", "id": RESERVATION_ID, "zone": "us-east-1a", "instances": 2})
    for overrides in (
        {"compute": "eks", "eks_capacity_type": "spot"},
        {"compute": "batch"},
        {"compute": "batch", "availability_zone": "us-east-1a", "capacity_reservation": on_demand},
    ):
        with pytest.raises(ConfigError, match="capacity_reservation=.* is not valid.*Capacity Blocks for ML only"):
            load_config({**CDK_JSON_CONTEXT, "instance_type": name, **overrides})


RESERVATION_ID = "cr-0123456789abcdef0"
PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"
GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/p5-reservations"


def _reserved(reservation: dict, **overrides: str):
    context = {**CDK_JSON_CONTEXT, "availability_zone": "us-east-1a", **overrides}
    return load_config({**context, "capacity_reservation": json.dumps(reservation)})


@pytest.mark.parametrize(
    ("compute", "reservation"),
    [
        ("batch", {"kind": "capacity_block", "id": RESERVATION_ID, "zone": "us-east-1a", "instances": 2}),
        ("eks", {"kind": "on_demand", "resource_group": GROUP, "zone": "us-east-1a", "instances": 8}),
        ("sagemaker", {"kind": "training_plan", "training_plan": PLAN, "instances": 2}),
    ],
)
def test_a_reservation_each_backend_takes_is_read(compute, reservation):
    found = _reserved(reservation, compute=compute).reservation
    assert found is not None and found.kind == reservation["kind"] and found.instances == reservation["instances"]


@pytest.mark.parametrize(("compute", "kind"), [(c, k) for c, kinds in KINDS.items() for k in kinds])
def test_every_reservation_a_backend_takes_says_when_its_capacity_is_taken_away(compute, kind):
    # The pipeline's stop-by is end - this lead (constructs/pipeline/reservation_end.py): a kind without one would
    # fail the synth of every environment that declares it.
    lead, by = CapacityReservation(kind=kind, instances=1).taken_away(compute)
    assert lead >= 0 and by


@pytest.mark.parametrize("compute", ["batch", "eks"])
def test_an_on_demand_reservation_is_taken_away_at_its_end_not_before(compute):
    # EC2 API reference, CapacityReservation EndDate: "When a Capacity Reservation expires, the reserved capacity is
    # released and you can no longer launch instances into it"; no early termination (unlike a Capacity Block's 30
    # minutes, tests/pipeline/test_reservation_pipeline.py).
    assert CapacityReservation(kind="on_demand", instances=1).taken_away(compute)[0] == 0


@pytest.mark.parametrize(
    ("overrides", "reservation", "expected"),
    [
        # SageMaker training jobs take a training plan, not an EC2 reservation; EC2 backends no plan.
        (
            {"compute": "sagemaker"},
            {"kind": "capacity_block", "id": RESERVATION_ID, "zone": "us-east-1a", "instances": 2},
            "capacity_reservation.kind='capacity_block' is not valid; expected training_plan with compute=sagemaker",
        ),
        (
            {},
            {"kind": "training_plan", "training_plan": PLAN, "instances": 2},
            "capacity_reservation.kind='training_plan' is not valid; expected capacity_block or on_demand",
        ),
        # A reservation must hold every node of a run.
        (
            {"nodes": "4"},
            {"kind": "capacity_block", "id": RESERVATION_ID, "zone": "us-east-1a", "instances": 2},
            "capacity_reservation.instances=2 is not valid; expected .* at least nodes \\(4\\)",
        ),
        # Its zone must be the training subnet's, named by the environment: a reservation never moves the file system.
        (
            {},
            {"kind": "capacity_block", "id": RESERVATION_ID, "zone": "us-east-1b", "instances": 2},
            "capacity_reservation.zone='us-east-1b' is not valid; expected .* availability_zone .* \\(now us-east-1a",
        ),
        (
            {},
            {"kind": "capacity_block", "id": "cr-123", "zone": "us-east-1a", "instances": 2},
            "capacity_reservation.id='cr-123' is not valid; expected a capacity reservation id like cr-0123",
        ),
        # A Capacity Block is bought by id; a group holds On-Demand reservations only.
        (
            {},
            {"kind": "capacity_block", "resource_group": GROUP, "zone": "us-east-1a", "instances": 2},
            "capacity_reservation.resource_group=.* is not valid; expected exactly one of id for a capacity_block",
        ),
        (
            {},
            {
                "kind": "on_demand",
                "resource_group": GROUP.replace("us-east-1", "us-west-2"),
                "zone": "us-east-1a",
                "instances": 2,
            },
            "resource_group=.* expected an On-Demand Capacity Reservation group's ARN in us-east-1",
        ),
        (
            {"compute": "sagemaker"},
            {"kind": "training_plan", "training_plan": PLAN, "instances": 2, "zone": "us-east-1a"},
            "capacity_reservation.zone='us-east-1a' is not valid; expected no zone for a training plan .* set "
            "availability_zone",
        ),
        ({}, {"kind": "capacity_block", "ids": RESERVATION_ID}, "capacity_reservation has no field 'ids'; expected"),
        # hypothesis found a key with a carriage return printed raw (two lines): it is named by its repr.
        ({}, {"\r": None}, "capacity_reservation has no field '\\\\r'; expected only kind"),
        (
            {"compute": "sagemaker", "sagemaker_spot": "true"},
            {"kind": "training_plan", "training_plan": PLAN, "instances": 2},
            "sagemaker_spot=True is not valid; expected false with a training plan",
        ),
        (
            {"compute": "eks", "eks_capacity_type": "spot"},
            {"kind": "on_demand", "id": RESERVATION_ID, "zone": "us-east-1a", "instances": 2},
            "eks_capacity_type='spot' is not valid; expected on_demand with a capacity_reservation",
        ),
    ],
)
def test_a_reservation_that_cannot_fit_is_refused_at_synth_in_one_line(overrides, reservation, expected):
    with pytest.raises(ConfigError, match=expected) as refused:
        _reserved(reservation, **overrides)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", efa_instance_types())
def test_every_catalogue_efa_type_trains_and_validates_on_sagemaker(name):
    # `cdk synth -c compute=sagemaker -c instance_type=X` for every EFA type: ml.X exists for training, and so does
    # the type its models are validated on.
    config = load_config({**CDK_JSON_CONTEXT, "compute": "sagemaker", "instance_type": name})
    assert config.instance.sagemaker_offered and config.single_node_instance.sagemaker_offered


def _run_app(**overrides: str) -> subprocess.CompletedProcess:
    """Run app.py as the CDK CLI does: context in CDK_CONTEXT_JSON."""
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**CDK_JSON_CONTEXT, **overrides}),
        "CDK_OUTDIR": str(ROOT / "build" / "bad-input"),
    }
    return subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_app_exits_non_zero_with_one_line_and_no_traceback():
    # The process as the CDK CLI runs it (context in CDK_CONTEXT_JSON), with a value that is not ASCII, so the one
    # line reaches stderr whole (test_config_properties.py checks main()'s line for any field and value).
    result = _run_app(nodes="\u0663")  # ARABIC-INDIC DIGIT THREE: int() would take it, the config does not
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: environment 'dev': nodes='\u0663' is not valid; expected an integer"]


def test_instance_without_efa_is_refused_in_process():
    # build_app refuses g5.xlarge (no EFA) before building anything, naming the field and the allowed types.
    expected = r"instance_type='g5.xlarge' is not valid; expected an instance type with EFA"
    with pytest.raises(ConfigError, match=expected):
        build_app(context={**CDK_JSON_CONTEXT, "compute": "batch", "instance_type": "g5.xlarge"})


def test_training_timeout_beyond_what_an_update_can_wait_fails_at_synth():
    # 121 hours could not be covered by UpdatePolicy's 7200-minute maximum: one line at synth, not a cut attempt.
    with pytest.raises(ConfigError, match=r"batch_train_timeout_hours=121 is not valid; expected .* 1 to 120"):
        build_app(context={**CDK_JSON_CONTEXT, "batch_train_timeout_hours": "121"})


@pytest.mark.slow
def test_instance_without_efa_is_refused_by_the_cli(tmp_path):
    # The real CDK CLI: non-zero exit, the one-line message on stderr, no traceback.
    env = {**os.environ, "PATH": f"{ROOT / 'node_modules' / '.bin'}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [
            str(ROOT / "node_modules" / ".bin" / "cdk"),
            "synth",
            "--no-notices",
            "-o",
            str(tmp_path / "out"),
            "-c",
            "compute=batch",
            "-c",
            "instance_type=g5.xlarge",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode != 0
    assert "error: environment 'dev': instance_type='g5.xlarge' is not valid" in result.stderr
    assert "Traceback" not in result.stderr


def test_readme_documents_every_field():
    # The configuration reference cannot drift from the typed config.
    from config.environment import FIELD_NAMES

    readme = (ROOT / "docs" / "configuration.md").read_text()  # the configuration reference, moved from README.md
    missing = [name for name in FIELD_NAMES if f"| `{name}` |" not in readme]
    assert missing == []


def test_tags_become_a_mapping():
    config = load_config({**CDK_JSON_CONTEXT, "tags": "CostCenter=ml-42,Team=research platform"})
    assert config.tag_map == {"CostCenter": "ml-42", "Team": "research platform"}
