"""The pictures' models (tools/diagram): what `make diagram` derives from the synthesized app and state machine.

The models need no Graphviz; only the last test renders, and it is skipped where `dot` is missing. The committed
pictures are held to the app through the models written beside them (docs/*.model.json), also without Graphviz.
"""

import json
import shutil
import struct
from pathlib import Path

import pytest

from config.environment import COMPUTE_BACKENDS
from tools.diagram.architecture import KINDS, Architecture, architecture, cluster_label
from tools.diagram.models import documents, drawings, model_path, png_sha256, read_model
from tools.diagram.states import (
    Picture,
    StateGraph,
    condense,
    definition_json,
    pipeline_definition,
    state_graph,
)
from tools.diagram.synthesized import DOCKER_IMAGE_ASSET, assemble, read_assembly


def model_of(synthesized) -> Architecture:
    return architecture(read_assembly(list(synthesized.stacks.values()), synthesized.outdir), "test")


@pytest.fixture(scope="module")
def batch(synth) -> Architecture:
    return model_of(synth())


@pytest.fixture(scope="module")
def eks(synth) -> Architecture:
    return model_of(synth(compute="eks"))


@pytest.fixture(scope="module")
def definition(synth) -> dict:
    return pipeline_definition(synth().raw("pipeline"))


def edge_labels(model: Architecture, source: str, target: str) -> set[str]:
    """Labels of the edges from node `source` to node `target` ("<cluster>/<type>")."""
    return {e.label for e in model.edges if e.source == source and e.target == target}


def names(model: Architecture, node_id: str) -> tuple[str, ...]:
    return next(n.names for n in model.nodes if n.id == node_id)


# --- architecture: stacks, main resources, main edges -------------------------------------------------------------


def test_each_stack_is_a_cluster_in_the_apps_order(synth, batch):
    assert batch.clusters == tuple(cluster_label(stack.stack_name) for stack in synth().stacks.values())


def test_every_resource_of_a_main_type_is_counted_in_its_stacks_node(synth, batch):
    synthesized = synth()
    for stack in synthesized.stacks.values():
        template = synthesized.templates[stack.stack_name]
        for cfn_type, kind in KINDS.items():
            count = sum(r["Type"] == cfn_type for r in template["Resources"].values())
            if count and not kind.shared_only:
                assert len(names(batch, f"{cluster_label(stack.stack_name)}/{cfn_type}")) == count


def test_only_the_security_groups_other_stacks_use_are_drawn(batch):
    # The EFA group (Batch hosts) and the Lustre group (FSx) are; the endpoints' group stays inside Network.
    assert names(batch, "Network/AWS::EC2::SecurityGroup") == ("Efa", "Lustre")


def test_the_data_repository_association_links_bucket_and_file_system_both_ways(batch):
    # One association keeps /fsx and the bucket in step, importing and exporting:
    # https://docs.aws.amazon.com/fsx/latest/LustreGuide/create-dra-linked-data-repo.html
    ends = {"Storage/AWS::FSx::FileSystem", "Storage/AWS::S3::Bucket"}
    links = [e for e in batch.edges if {e.source, e.target} == ends]
    assert len(links) == 1 and links[0].both_ways


def test_batch_hosts_mount_fsx_and_sit_in_the_efa_group(batch):
    hosts = "Batch/AWS::Batch::ComputeEnvironment"
    assert edge_labels(batch, hosts, "Storage/AWS::FSx::FileSystem") == {"mounts /fsx"}
    assert edge_labels(batch, hosts, "Network/AWS::EC2::SecurityGroup") == {"EFA"}


def test_batch_jobs_run_the_training_image(batch):
    assert edge_labels(batch, "Batch/AWS::Batch::JobDefinition", f"Registry/{DOCKER_IMAGE_ASSET}") == {"image"}


def test_with_an_image_tag_batch_jobs_run_the_image_from_the_registrys_repository(synth):
    model = model_of(synth(image_tag="v1"))
    assert edge_labels(model, "Batch/AWS::Batch::JobDefinition", "Registry/AWS::ECR::Repository") == {"image"}
    assert f"Registry/{DOCKER_IMAGE_ASSET}" not in {node.id for node in model.nodes}


def test_the_pipeline_submits_to_the_job_queues_and_notifies_the_topic(batch):
    pipeline = "Pipeline/AWS::StepFunctions::StateMachine"
    assert edge_labels(batch, pipeline, "Batch/AWS::Batch::JobQueue") == {"submits jobs"}
    assert edge_labels(batch, pipeline, "Alerts/AWS::SNS::Topic") == {"notifies"}


def test_alarms_and_the_budget_notify_the_topic(batch):
    assert edge_labels(batch, "Observability/AWS::CloudWatch::Alarm", "Alerts/AWS::SNS::Topic") == {"alarms"}
    assert edge_labels(batch, "Observability/AWS::Budgets::Budget", "Alerts/AWS::SNS::Topic") == {"budget alerts"}


def test_eks_nodes_join_the_cluster_that_mounts_fsx_and_runs_the_pipelines_jobs(eks):
    cluster = "Eks/AWS::EKS::Cluster"
    assert edge_labels(eks, "Eks/AWS::EKS::Nodegroup", cluster) == {"joins"}
    assert edge_labels(eks, cluster, "Storage/AWS::FSx::FileSystem") == {"mounts /fsx"}
    assert edge_labels(eks, "Pipeline/AWS::StepFunctions::StateMachine", cluster) == {"runs jobs"}


def two_stacks(launch_template_user_data: object) -> Architecture:
    """Storage with a file system; Compute with a compute environment whose launch template carries the user data."""
    storage = {"Resources": {"Fs": {"Type": "AWS::FSx::FileSystem"}}, "Outputs": {"FsId": {"Value": {"Ref": "Fs"}}}}
    compute = {
        "Resources": {
            "Env": {
                "Type": "AWS::Batch::ComputeEnvironment",
                "Properties": {"LaunchTemplate": {"LaunchTemplateId": {"Ref": "Template"}}},
            },
            "Template": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"UserData": launch_template_user_data}},
        }
    }
    return architecture(assemble({"App-Storage": storage, "App-Compute": compute}, {}, {}), "test")


def test_a_reference_through_a_resource_that_is_no_node_is_an_edge():
    # Fn::GetStackOutput returns another stack's output: https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-getstackoutput.html
    model = two_stacks(
        {"Fn::Join": ["", ["mount ", {"Fn::GetStackOutput": {"StackName": "App-Storage", "OutputName": "FsId"}}]]}
    )
    assert edge_labels(model, "Compute/AWS::Batch::ComputeEnvironment", "Storage/AWS::FSx::FileSystem") == {
        "mounts /fsx"
    }


def test_without_a_reference_there_is_no_edge():
    assert two_stacks("mount nothing").edges == ()


def test_sub_and_import_value_name_the_resources_they_read():
    # ${Name.Attribute} in Fn::Sub, and an export read with Fn::ImportValue:
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-sub.html
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-importvalue.html
    alerts = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"Arn": {"Value": {"Ref": "Topic"}, "Export": {"Name": "TopicArn"}}},
    }
    pipeline = {
        "Resources": {
            "Records": {"Type": "AWS::S3::Bucket"},
            "Machine": {
                "Type": "AWS::StepFunctions::StateMachine",
                "Properties": {
                    "Topic": {"Fn::ImportValue": "TopicArn"},
                    "Bucket": {"Fn::Sub": "${Records.Arn}/runs/*"},
                },
            },
        }
    }
    templates: dict[str, dict] = {"App-Alerts": alerts, "App-Pipeline": pipeline}
    model = architecture(assemble(templates, {}, {}), "test")
    machine = "Pipeline/AWS::StepFunctions::StateMachine"
    assert edge_labels(model, machine, "Alerts/AWS::SNS::Topic") == {"notifies"}
    assert edge_labels(model, machine, "Pipeline/AWS::S3::Bucket") == {"run records"}


# --- the pipeline: states and failure paths ----------------------------------------------------------------------


def raw_states(machine: dict) -> dict[str, dict]:
    """Every state of a definition, branches included, read directly from the ASL."""
    found = {}
    for name, body in machine["States"].items():
        found[name] = body
        for branch in body.get("Branches", []) + [b for b in (body.get("ItemProcessor"), body.get("Iterator")) if b]:
            found.update(raw_states(branch))
    return found


def box_of(picture: Picture) -> dict[str, str]:
    return {state: box.id for box in picture.boxes for state in box.states}


def past_pass(states: dict[str, dict], name: str) -> str:
    while states[name]["Type"] == "Pass" and "Next" in states[name]:
        name = states[name]["Next"]
    return name


def test_the_definition_read_is_the_state_machine_the_cli_starts():
    # The CLI starts the machine named by the Pipeline stack's StateMachineArn output (tools/pipeline_cli.py).
    def machine(start: str) -> dict:
        return {
            "Type": "AWS::StepFunctions::StateMachine",
            "Properties": {
                "DefinitionString": f'{{"StartAt": "{start}", "States": {{"{start}": {{"Type": "Succeed"}}}}}}'
            },
        }

    template = {
        "Resources": {"Scaling": machine("Scale"), "Training": machine("Train")},
        "Outputs": {"StateMachineArn": {"Value": {"Ref": "Training"}}},
    }
    assert pipeline_definition(template)["StartAt"] == "Train"


def test_tokens_become_placeholders_that_keep_the_json_valid():
    definition = {
        "Fn::Join": [
            "",
            [
                '{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:',
                {"Ref": "AWS::Partition"},
                ':states:::sns:publish", "TimeoutSeconds": ',
                {"Fn::GetAtt": ["Config", "Seconds"]},
                ', "End": true}}}',
            ],
        ]
    }
    state = definition_json(definition)["States"]["A"]
    assert (state["Resource"], state["TimeoutSeconds"]) == (
        "arn:<Ref AWS::Partition>:states:::sns:publish",
        "<Config.Seconds>",
    )


def test_every_state_of_the_definition_is_in_the_graph(definition):
    assert set(state_graph(definition).states) == set(raw_states(definition))


def test_every_catch_is_a_transition_with_its_error_names(definition):
    # A Catcher sends the errors it names to its Next: https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
    transitions = set(state_graph(definition).transitions)
    catches = [(name, catcher) for name, body in raw_states(definition).items() for catcher in body.get("Catch", [])]
    assert catches
    for name, catcher in catches:
        assert (name, catcher["Next"], tuple(catcher["ErrorEquals"])) in {
            (t.source, t.target, t.errors) for t in transitions if t.kind == "catch"
        }


def test_every_state_is_drawn_in_a_box_or_folded_into_the_arrows_through_it(definition):
    picture = condense(state_graph(definition))
    states = raw_states(definition)
    assert set(box_of(picture)) | set(picture.folded) == set(states)
    assert not set(box_of(picture)) & set(picture.folded)
    assert {states[name]["Type"] for name in picture.folded} == {"Pass"}


def test_every_catch_is_drawn_as_a_dashed_arrow_with_its_error_names(definition):
    picture = condense(state_graph(definition))
    states, boxes = raw_states(definition), box_of(picture)
    drawn = {(a.source, a.target): a.errors for a in picture.arrows if a.kind == "catch"}
    for name, body in states.items():
        for catcher in body.get("Catch", []):
            target = boxes[past_pass(states, catcher["Next"])]
            assert set(catcher["ErrorEquals"]) <= set(drawn[(boxes[name], target)])


def test_every_retry_is_annotated_with_its_errors_and_attempts(definition):
    # A retrier without MaxAttempts retries 3 times: https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
    retried = {box.states[0]: box.retry for box in condense(state_graph(definition)).boxes if box.retry}
    expected = {
        name: tuple(f"{', '.join(r['ErrorEquals'])} ×{r.get('MaxAttempts', 3)}" for r in body["Retry"])
        for name, body in raw_states(definition).items()
        if body.get("Retry")
    }
    assert retried == expected


def small_machine(states: dict) -> StateGraph:
    return state_graph({"StartAt": next(iter(states)), "States": states})


def test_pass_states_are_folded_into_the_arrows_through_them():
    picture = condense(
        small_machine(
            {
                "Prepare": {"Type": "Pass", "Next": "Shape"},
                "Shape": {"Type": "Pass", "Next": "Work"},
                "Work": {"Type": "Task", "Resource": "arn:aws:states:::sns:publish", "End": True},
            }
        )
    )
    assert (picture.start, picture.folded, [b.id for b in picture.boxes]) == ("Work", ("Prepare", "Shape"), ["Work"])


def test_fail_states_entered_from_the_same_state_share_one_box():
    picture = condense(
        small_machine(
            {
                "Check": {
                    "Type": "Choice",
                    "Default": "Work",
                    "Choices": [
                        {"Variable": "$.a", "IsPresent": False, "Next": "InvalidA"},
                        {"Variable": "$.b", "IsPresent": False, "Next": "InvalidB"},
                    ],
                },
                "Work": {"Type": "Succeed"},
                "InvalidA": {"Type": "Fail"},
                "InvalidB": {"Type": "Fail"},
            }
        )
    )
    refusals = [b for b in picture.boxes if b.type == "Fail"]
    assert [(b.states, b.label) for b in refusals] == [(("InvalidA", "InvalidB"), "Invalid… ×2")]


def test_a_chain_of_input_checks_is_one_box():
    picture = condense(
        small_machine(
            {
                "IsObject": {
                    "Type": "Choice",
                    "Default": "HasName",
                    "Choices": [{"Variable": "$", "IsPresent": False, "Next": "NotObject"}],
                },
                "HasName": {
                    "Type": "Choice",
                    "Default": "Work",
                    "Choices": [{"Variable": "$.name", "IsPresent": False, "Next": "NoName"}],
                },
                "Work": {"Type": "Succeed"},
                "NotObject": {"Type": "Fail"},
                "NoName": {"Type": "Fail"},
            }
        )
    )
    assert sorted(b.states for b in picture.boxes) == [("IsObject", "HasName"), ("NotObject", "NoName"), ("Work",)]


def test_a_state_that_catches_into_itself_keeps_its_arrow():
    picture = condense(
        small_machine(
            {
                "Poll": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::sns:publish",
                    "End": True,
                    "Catch": [{"ErrorEquals": ["Busy"], "Next": "Poll"}],
                }
            }
        )
    )
    assert [(a.source, a.target, a.errors) for a in picture.arrows] == [("Poll", "Poll", ("Busy",))]


# --- the committed pictures: docs/<picture>.png with its model beside it --------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"
DIAGRAM_ENV = "prod"  # the Makefile's DIAGRAM_ENV, which the committed pictures are drawn for
REDRAW = (
    "draw it again with `make diagram` (these pictures alone: .venv/bin/python -m tools.diagram --out docs; both need"
    " Graphviz: apt-get install -y graphviz) and commit the PNG with its model"
)


def committed_pictures() -> list[Path]:
    return sorted(p for p in DOCS.glob(f"*-{DIAGRAM_ENV}-*.png") if p.stem.startswith(("architecture-", "pipeline-")))


def test_every_backend_has_both_pictures_committed_each_with_its_model():
    expected = {
        f"{kind}-{DIAGRAM_ENV}-{compute}.png" for kind in ("architecture", "pipeline") for compute in COMPUTE_BACKENDS
    }
    assert {p.name for p in committed_pictures()} == expected
    assert {p.name for p in DOCS.glob("*.model.json")} == {model_path(DOCS / name).name for name in expected}


@pytest.mark.parametrize("picture", [p.name for p in committed_pictures()])
def test_each_committed_picture_is_the_one_drawn_with_its_model(picture):
    # The model file records the digest of the PNG rendered from it: a PNG and a model from different draws fail.
    png = DOCS / picture
    digest, _ = read_model(model_path(png))
    assert png_sha256(png) == digest, f"{picture} is not the picture drawn with its model: {REDRAW}"


@pytest.mark.parametrize("compute", COMPUTE_BACKENDS)
def test_the_committed_pictures_show_the_app_as_it_is(synth, compute):
    # The app's models now, derived as `make diagram` derives them, against the ones the committed PNGs were drawn
    # from: a change to the stacks, their references or the state machine that a picture would show fails here.
    synthesized = synth(env=DIAGRAM_ENV, compute=compute)
    current = documents(drawings(read_assembly(list(synthesized.stacks.values()), synthesized.outdir), compute))
    for kind, model in current.items():
        png = DOCS / f"{kind}-{DIAGRAM_ENV}-{compute}.png"
        _, committed = read_model(model_path(png))
        # Through JSON, so tuples and lists compare alike.
        assert json.loads(json.dumps(model)) == committed, f"{png.name} is stale: {REDRAW}"


# --- rendering ---------------------------------------------------------------------------------------------------


def png_width(png: Path) -> int:
    return struct.unpack(">I", png.read_bytes()[16:20])[0]  # the IHDR chunk's width


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install -y graphviz)")
def test_both_pictures_render_at_readme_width(batch, definition, tmp_path):
    from tools.diagram.render import render_architecture, render_pipeline

    render_architecture(batch, tmp_path / "architecture.png")
    render_pipeline(condense(state_graph(definition)), "test", tmp_path / "pipeline.png")
    # 14 inches at 72 dpi: the README's width, where the labels still read.
    assert all(png_width(tmp_path / name) <= 1008 for name in ("architecture.png", "pipeline.png"))
