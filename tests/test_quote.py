"""contracts/quote.py: a run's quote from the model's FLOPs, the catalogue's peak and price; the budget's refusal."""

import json
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from config import load_config
from config.catalogue import SAGEMAKER_ESTIMATE_RATIO
from contracts.quote import (
    ASSUMED_MFU_PERCENT,
    COMPILE_MINUTES,
    SANITY_MINUTES,
    VALIDATION_MINUTES,
    Quote,
    QuoteTerms,
    about_usd,
    budget_refusal,
    quote,
    unread_budget_refusal,
)
from contracts.run import WorkloadSchema, filled
from contracts.workload import built_in_workloads
from contracts.workload_cost import CostModel
from tests.synthesis import CAPACITY_BLOCK, context
from tools.quote import quote_and_actual

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training_image"))
from efa_training.workloads.gpt.sizes import MODEL_SIZES, flops_per_token  # noqa: E402

GPT = next(w for w in built_in_workloads() if w.name == "gpt")
assert GPT.cost is not None and GPT.cost.values is not None
SAMPLE_TFLOPS = GPT.cost.values  # the built-in GPT trainer's declared cost model


def _run(**hyperparameters: object) -> dict:
    return filled({"nodes": 2, "hyperparameters": hyperparameters}, 2)


@pytest.fixture(scope="module")
def terms() -> QuoteTerms:
    return QuoteTerms.of(load_config(context()))


def test_a_gpt_step_takes_batch_size_samples_per_worker_as_the_trainer_does_by_default():
    # The declared cost model counts batch_size samples per worker and step: the trainer's micro-batch times its
    # gradient accumulation, which the pipeline's runs leave at 1.
    from efa_training.train_config import TrainConfig

    assert TrainConfig.__dataclass_fields__["grad_accum_steps"].default == 1
    assert GPT.cost is not None and (GPT.cost.steps, GPT.cost.batch_size, GPT.cost.by) == (
        "max_steps",
        "batch_size",
        "model",
    )


def test_flops_per_sample_are_the_training_images_own():
    sizes = next(f for f in GPT.hyperparameters if f.key == "model").choices
    assert set(SAMPLE_TFLOPS) == set(sizes) == set(MODEL_SIZES)
    for model, size in MODEL_SIZES.items():
        assert SAMPLE_TFLOPS[model] == pytest.approx(flops_per_token(size) * size.seq_len / 1e12, rel=1e-5)


def test_a_quote_is_steps_times_the_step_time_at_the_mfu_on_the_runs_nodes(terms):
    q = quote(_run(model="1.3b", max_steps=1000, batch_size=4), terms)
    assert q.hours is not None
    step = 4 * SAMPLE_TFLOPS["1.3b"] / (terms.peak_tflops_per_worker * ASSUMED_MFU_PERCENT / 100)
    assert q.hours == pytest.approx(1000 * step / 3600)
    assert terms.node_usd_per_hour and terms.validation_usd_per_hour
    sanity = SANITY_MINUTES / 60
    assert q.usd == pytest.approx(
        2 * (q.hours + sanity) * terms.node_usd_per_hour + VALIDATION_MINUTES / 60 * terms.validation_usd_per_hour
    )
    assert q.basis.startswith(f"MFU {ASSUMED_MFU_PERCENT:g}% assumed")


def test_a_measured_mfu_replaces_the_assumption(terms):
    run = _run(model="125m", max_steps=5000)
    assumed, measured = quote(run, terms), quote(run, terms, measured_mfu_percent=ASSUMED_MFU_PERCENT / 2)
    assert assumed.hours is not None
    assert measured.hours == pytest.approx(2 * assumed.hours)
    assert measured.basis.startswith("MFU 20.0% measured")  # one decimal, as the pipeline writes it


def test_a_workload_without_a_flops_model_has_no_estimate(terms):
    assert quote({**_run(), "workload": "my-trainer"}, terms).usd is None
    ctr = filled({"nodes": 2, "workload": "ctr-ps"}, 2)
    assert quote(ctr, terms).basis == "no FLOPs model for this workload"


def test_reserved_nodes_cost_the_run_nothing_more_than_its_validation():
    reserved = QuoteTerms.of(load_config(context(**CAPACITY_BLOCK)))
    assert reserved.node_usd_per_hour == 0.0 and "reserved capacity" in reserved.price_basis
    q = quote(_run(model="1.3b", max_steps=1000), reserved)
    assert q.usd == pytest.approx(VALIDATION_MINUTES / 60 * (reserved.validation_usd_per_hour or 0))


def test_a_sagemaker_quote_at_an_estimated_price_says_it_is_one():
    # prod's p5 types have no recorded ml.* list price: their SageMaker price is EC2's x 1.15 (config/catalogue.py),
    # which the quote's basis names; dev's g5 types have recorded list prices and read as they did.
    prod = QuoteTerms.of(load_config(context(env="prod", compute="sagemaker")))
    assert prod.price_basis == f"SageMaker on-demand, an estimate: EC2's price x {SAGEMAKER_ESTIMATE_RATIO}"
    assert (
        quote(_run(model="1.3b", max_steps=1000), prod)
        .line()
        .endswith(f"MFU {ASSUMED_MFU_PERCENT:g}% assumed, SageMaker on-demand, an estimate: EC2's price x 1.15)")
    )
    assert QuoteTerms.of(load_config(context(compute="sagemaker"))).price_basis == "SageMaker on-demand"


def test_the_price_basis_names_spot_only_where_the_run_could_have_it():
    # Batch runs multi-node jobs on demand only (the README's backend table): "Spot costs less" there misled.
    assert QuoteTerms.of(load_config(context(compute="batch"))).price_basis == "EC2 on-demand"
    assert QuoteTerms.of(load_config(context(compute="eks"))).price_basis == "EC2 on-demand"
    spot_nodes = QuoteTerms.of(load_config(context(compute="eks", eks_capacity_type="spot")))
    assert spot_nodes.price_basis == "EC2 on-demand; the Spot node group costs less"
    managed_spot = QuoteTerms.of(load_config(context(compute="sagemaker", sagemaker_spot=True)))
    assert managed_spot.price_basis == "SageMaker on-demand; managed Spot costs less"


def test_the_quote_refuses_a_batch_run_on_fewer_nodes_than_its_jobs_take(tmp_path, capsys):
    # prod's Batch job definitions fix 4 nodes, so `start` (the deployed MinNodes) refuses 2; the quote did not.
    from tools import pipeline_cli

    nodes = load_config(context(env="prod")).nodes
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"run_id": "two-001", "dataset": "datasets/x/", "nodes": 2, "baseline": 3.2}))
    assert pipeline_cli.main(["quote", "prod", str(run)]) == 2
    assert f"exactly {nodes}: this backend's multi-node job definitions fix the node count" in capsys.readouterr().err


class _NoCredentials:
    """A boto3 session with no credentials: every client's call fails as botocore fails it."""

    def client(self, *args, **kwargs):
        from botocore.exceptions import NoCredentialsError

        raise NoCredentialsError()


def test_start_refuses_a_run_whose_budget_cannot_be_read_and_quote_says_it_would(capsys):
    # An unreadable budget passed every run (issue 47): start refuses it as the pipeline's BudgetNotRead does, unless
    # the run may exceed the budget; `quote` (offline too) prints the quote and says what start would do.
    from tools import pipeline_cli

    config = load_config(context())
    run = filled({"run_id": "r-001", "dataset": "datasets/x/", "baseline": 3.2}, config.nodes)
    with pytest.raises(pipeline_cli.CliError) as refused:
        pipeline_cli.quoted(run, "dev", _NoCredentials(), sys.stdout)
    assert str(refused.value) == unread_budget_refusal(config.budget_name, "Unable to locate credentials")
    pipeline_cli.quoted(run, "dev", _NoCredentials(), sys.stdout, starting=False)
    assert "start and the pipeline refuse it unless it sets may_exceed_budget: true" in capsys.readouterr().out
    pipeline_cli.quoted({**run, "may_exceed_budget": True}, "dev", _NoCredentials(), sys.stdout)  # not refused


def test_a_neuroncore_is_a_worker_and_gets_its_share_of_the_chips_peak():
    # One worker per NeuronCore (trn1: 2 per chip), each with batch_size sequences: the peak per worker is half a
    # chip's, so a step takes twice as long as per-chip arithmetic says; a GPU's worker is the GPU.
    config = load_config(context(instance_type="trn1.32xlarge"))
    trainium = QuoteTerms.of(config)
    chip = config.instance.peak_bf16_tflops_per_accelerator
    assert config.instance.cores_per_accelerator == 2 and trainium.peak_tflops_per_worker == chip / 2
    hours = quote(_run(model="1.3b", max_steps=1000, batch_size=4), trainium).hours
    assert hours == pytest.approx(1000 * 4 * SAMPLE_TFLOPS["1.3b"] / (chip / 2 * ASSUMED_MFU_PERCENT / 100) / 3600)


def test_a_trainium_run_is_quoted_its_compile_job_on_its_nodes():
    trainium = QuoteTerms.of(load_config(context(instance_type="trn1.32xlarge")))
    assert trainium.compiles_ahead and trainium.node_usd_per_hour
    q = quote(_run(model="1.3b", max_steps=1000), trainium)
    assert q.usd is not None and q.hours is not None
    others = 2 * (SANITY_MINUTES + COMPILE_MINUTES) / 60 * trainium.node_usd_per_hour
    assert q.usd == pytest.approx(
        2 * q.hours * trainium.node_usd_per_hour
        + others
        + VALIDATION_MINUTES / 60 * (trainium.validation_usd_per_hour or 0)
    )


def test_a_type_without_a_price_has_no_estimate(terms):
    assert quote(_run(), replace(terms, node_usd_per_hour=None)).usd is None


@pytest.mark.parametrize(
    ("q", "limit", "spent", "refused"),
    [
        (Quote(120.0, 1.0, ""), 1000, 500, False),
        (Quote(120.0, 1.0, ""), 1000, 900, True),  # $100 left
        (Quote(None, None, ""), 1000, 999, False),
        (Quote(None, None, ""), 1000, 1000, True),  # spent: nothing is left for a run of unknown cost
        (Quote(0.0, 1.0, ""), 1000, 1200, False),  # reserved capacity adds nothing
    ],
)
def test_the_budget_refuses_a_quote_above_what_is_left(q, limit, spent, refused):
    line = budget_refusal(q, limit, spent)
    assert (line is not None) == refused
    if line:
        assert "\n" not in line and line.endswith(("may_exceed_budget: true", "to run anyway"))


def test_a_quotes_line_gives_the_training_time_in_hours_minutes_or_under_a_minute():
    assert [Quote(1.0, h, "b").line() for h in (2.345, 0.69, 1e-6)] == [
        "quote: ~$1 for ~2.3 h of training (b)",
        "quote: ~$1 for ~41 min of training (b)",
        "quote: ~$1 for under a minute of training (b)",
    ]


def test_an_estimate_is_never_printed_to_the_cent():
    assert (about_usd(1234.56), about_usd(7.891), about_usd(0.01234)) == ("~$1,200", "~$7.9", "~$0.012")


def _history(*states: tuple[str, float]) -> list[dict]:
    """An execution's history: each state entered, then left `hours` later (Step Functions GetExecutionHistory)."""
    now, events = datetime(2026, 11, 27, tzinfo=UTC), []
    quoted = {"run": {"quote": {"usd": 12.5, "hours": 1.0, "basis": "MFU 40% assumed, EC2 on-demand"}}}
    events.append({"timestamp": now, "stateExitedEventDetails": {"name": "QuoteRun", "output": json.dumps(quoted)}})
    for name, hours in states:
        events.append({"timestamp": now, "stateEnteredEventDetails": {"name": name}})
        now += timedelta(hours=hours)
        events.append({"timestamp": now, "stateExitedEventDetails": {"name": name}})
    return events


def test_describe_sets_the_recorded_quote_beside_what_the_job_states_cost():
    config = load_config(context())
    terms = QuoteTerms.of(config)
    assert terms.node_usd_per_hour and terms.validation_usd_per_hour
    lines = quote_and_actual(_history(("SanityCheck", 0.25), ("Train-my-trainer", 2.0), ("Validate", 0.5)), 2, config)
    usd = 2 * 2.25 * terms.node_usd_per_hour + 0.5 * terms.validation_usd_per_hour
    assert lines == [
        "quote      ~$12 for ~1 h of training (MFU 40% assumed, EC2 on-demand)",
        f"actual     {about_usd(usd)} at most (SanityCheck 0.25 h, Train-my-trainer 2.00 h, Validate 0.50 h; "
        f"2 x {config.instance_type}, waits included)",
    ]


def _evaluate(expression: str, state_input: dict):
    """A JSONata state's expression on `state_input`, with the engine the emulator uses (jsonata-python)."""
    import jsonata

    body = expression.removeprefix("{%").removesuffix("%}").replace("$states.input", "$")
    return jsonata.Jsonata(body).evaluate(state_input)


def test_the_pipelines_quote_is_the_clis_and_reads_nothing_of_a_declared_workload(terms):
    from constructs.pipeline.run_quote import _quoted_run

    run = _run(model="1.3b", max_steps=1000, batch_size=4)
    expected = quote(run, terms)
    got = _evaluate(_quoted_run(terms), {"run": _recorded(run)})["quote"]
    assert got["usd"] == pytest.approx(expected.usd) and got["hours"] == pytest.approx(expected.hours)
    # A declared workload's hyperparameters may be any JSON: a string max_steps would be a JSONata error (T2001) if
    # multiplied, and an error in a Pass state ends the run.
    declared = {**run, "workload": "mine", "hyperparameters": {"model": 7, "max_steps": "all", "batch_size": "x"}}
    assert _evaluate(_quoted_run(terms), {"run": _recorded(declared)})["quote"]["usd"] is None


def _recorded(run: dict, workloads: dict | None = None) -> dict:
    """The run as the pipeline holds it: its workload's record summary inside (`registered`, whose cost model
    QuoteRun reads: constructs/pipeline/workload_record.py); a workload nobody declares has none."""
    from contracts.run import DEFAULT_WORKLOAD, known_workloads

    schema = known_workloads(workloads).get(run.get("workload", DEFAULT_WORKLOAD))
    cost = schema.cost.as_json() if schema and schema.cost else None
    return {**run, "registered": {"cost": cost}}


# A declared workload that states its cost: one number of TFLOPs per sample, or one per size.
FLAT = WorkloadSchema((), cost=CostModel("epochs_steps", "per_worker", tflops=2.0))


def test_a_declared_workload_with_a_cost_model_is_quoted_by_it(terms):
    run = {"nodes": 2, "workload": "mine", "hyperparameters": {"epochs_steps": 500, "per_worker": 3}}
    q = quote(run, terms, workloads={"mine": FLAT})
    assert q.hours == pytest.approx(500 * 3 * 2.0 / (terms.peak_tflops_per_worker * ASSUMED_MFU_PERCENT / 100) / 3600)


def test_the_pipeline_quotes_a_declared_workload_as_the_cli_does(terms):
    from constructs.pipeline.run_quote import _quoted_run

    run = {"nodes": 2, "workload": "mine", "hyperparameters": {"epochs_steps": 500, "per_worker": 3}}
    got = _evaluate(_quoted_run(terms), {"run": _recorded(run, {"mine": FLAT})})["quote"]
    assert got["usd"] == pytest.approx(quote(run, terms, workloads={"mine": FLAT}).usd)


def test_a_tensor_parallel_run_shares_each_samples_work_among_its_group(terms):
    # tp 4: each sample's FLOPs spread over 4 workers, whose group takes one batch per step (cost split_by), so the
    # same run is quoted a quarter of the training hours, by the CLI and the pipeline alike.
    from constructs.pipeline.run_quote import _quoted_run

    assert GPT.cost is not None and GPT.cost.split_by == ("tensor_parallel", "pipeline_parallel")
    alone = quote(_run(model="13b", max_steps=1000, strategy="fsdp"), terms)
    split = _run(model="13b", max_steps=1000, strategy="fsdp", tensor_parallel=4)
    q = quote(split, terms)
    assert alone.hours is not None and q.hours == pytest.approx(alone.hours / 4)
    got = _evaluate(_quoted_run(terms), {"run": _recorded(split)})["quote"]
    assert got["hours"] == pytest.approx(q.hours) and got["usd"] == pytest.approx(q.usd)


def test_a_pipeline_and_tensor_parallel_run_shares_each_samples_work_among_both_degrees(terms):
    # tp 2 x pp 4: one sample's FLOPs spread over the 8 workers of a pipeline of tensor-parallel groups (split_by, a
    # list: their product), each step longer by the pipeline's bubble, by the CLI and the pipeline's JSONata alike.
    from constructs.pipeline.run_quote import _quoted_run

    alone = quote(_run(model="70b", max_steps=1000, strategy="fsdp"), terms)
    split = _run(model="70b", max_steps=1000, strategy="fsdp", tensor_parallel=2, pipeline_parallel=4)
    q = quote(split, terms)
    assert alone.hours is not None and q.hours == pytest.approx(alone.hours / 8 * 7 / 4)  # 4 stages: 8 in 4 of 2
    got = _evaluate(_quoted_run(terms), {"run": _recorded(split)})["quote"]
    assert got["hours"] == pytest.approx(q.hours) and got["usd"] == pytest.approx(q.usd)


@pytest.mark.parametrize(("batch_size", "stages", "bubble"), [(8, 4, 7 / 4), (8, 1, 1.0), (6, 4, 9 / 6), (2, 4, 5 / 2)])
def test_a_pipeline_run_is_quoted_with_its_bubble(terms, batch_size, stages, bubble):
    # 1F1B idles (P-1)/(m+P-1) of each step, m the batch's microbatches (8 on 4 stages: 4 of 2; 6: 6 of 1; a batch of 2,
    # fewer sequences than stages: 2 of 1), so a step takes (m+P-1)/m as long as its FLOPs alone (cost
    # pipeline_stages), by the CLI and the pipeline's JSONata alike.
    from constructs.pipeline.run_quote import _quoted_run

    layout = {"model": "70b", "max_steps": 1000, "strategy": "fsdp", "tensor_parallel": 8, "batch_size": batch_size}
    alone = quote(_run(**layout), terms)
    run = _run(**layout, pipeline_parallel=stages)
    q = quote(run, terms)
    assert alone.hours is not None and q.hours == pytest.approx(alone.hours / stages * bubble)
    got = _evaluate(_quoted_run(terms), {"run": _recorded(run)})["quote"]
    assert got["hours"] == pytest.approx(q.hours) and got["usd"] == pytest.approx(q.usd)


def test_the_quotes_bubble_counts_the_microbatches_the_trainer_cuts():
    # contracts/ cannot import the training image: the cost model's microbatches (CostModel.bubble) are held to the
    # trainer's own rule (sizes.pipeline_microbatches, one micro-step a step, as pipeline runs take) here.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training_image"))
    from efa_training.workloads.gpt.sizes import pipeline_microbatches

    assert GPT.cost is not None
    for stages in range(1, 9):
        for batch in range(1, 17):
            m = pipeline_microbatches(stages, 1, batch) if stages > 1 else 1
            bubble = GPT.cost.bubble({"pipeline_parallel": stages, "batch_size": batch})
            assert bubble == pytest.approx((m + stages - 1) / m), (stages, batch)
