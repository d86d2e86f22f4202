"""A run's quote before it starts: its training hours and what it will cost, one arithmetic for CLI and pipeline.

For a workload that declares a cost model (contracts/workload_cost.py; the built-in GPT trainer's: training FLOPs per
token x seq_len of each size, training_image/efa_training/workloads/gpt/sizes.py), with one worker per GPU or per
NeuronCore:
    seconds per step = batch_size x FLOPs per sample / (split x peak FLOP/s per worker x MFU)
(split: how many workers share one sample's work, the tensor-parallel degree, where the cost model names it)
Tokens per step and throughput both grow with the world size, so the node count leaves the hours and stays in the cost
(linear scaling assumed; communication is part of the MFU):
    cost = hours x nodes x node price  +  the sanity check (SANITY_MINUTES on the run's nodes; Batch and EKS)
                                       +  the compile job (COMPILE_MINUTES on the run's nodes; Trainium)
                                       +  the validation job (VALIDATION_MINUTES on one node of the validation type)
MFU is measured where this environment's earlier runs reported it (the EfaTraining MFU metric over MEASURED_DAYS,
`measured_mfu_query`; the image measures it on CUDA), else ASSUMED_MFU_PERCENT, and the quote says which: the CLI and
the pipeline's first states read the same figure, so the next run's quote learns from the last run's throughput.
Reserved capacity (a Capacity Block, an On-Demand Capacity Reservation, a training plan) is paid for whether a run
uses it or not, so its node-hours add nothing.
A run of a workload without a cost model (the parameter servers, most declared ones) has no estimate, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from config.catalogue import SAGEMAKER_ESTIMATE_RATIO, Accelerator
from config.layout import TRAINING_METRICS_NAMESPACE
from contracts.run import DEFAULT_WORKLOAD, WorkloadSchemas, known_workloads

if TYPE_CHECKING:
    from config import EnvironmentConfig

# A well-tuned large run, below the 46.2% MFU PaLM reports for its 540B training (Chowdhery et al. 2022, "PaLM",
# table 3), which took years of tuning on TPU v4. A measured figure replaces it.
ASSUMED_MFU_PERCENT = 40.0
# The run's other jobs, at assumed durations: the sanity check on the run's nodes (inside the training job on
# SageMaker, so in its hours) and the validation job on one node of the catalogue's validation type.
SANITY_MINUTES = 10
VALIDATION_MINUTES = 30
# Trainium's ahead-of-time compile job on the run's nodes (a trial run, then the Neuron compiler over every graph):
# assumed for every run, though a shape compiled before is skipped, so a quote is an upper bound there.
COMPILE_MINUTES = 60
MEASURED_DAYS = 14  # how far back a measured MFU is averaged


def measured_mfu_query(environment: str, model: str | None = None) -> str:
    """CloudWatch GetMetricData's expression for the MFU this environment's runs reported (of one model size, where
    `model` is given: the image puts MFU by Environment and Model too): each hour's average over the runs that
    reported in it, one series (metric math AVG over a SEARCH: CloudWatch user guide, "Use search expressions in
    graphs", "Metric math syntax and functions"), so the answer stays small however many runs there were (a Step
    Functions state's result is at most 256 KiB); the figure is the mean of its values."""
    dimensions, only = ("Environment,Model", f' Model="{model}"') if model else ("Environment,RunId", "")
    return (
        f'AVG(SEARCH(\'{{{TRAINING_METRICS_NAMESPACE},{dimensions}}} MetricName="MFU" '
        f"Environment=\"{environment}\"{only}', 'Average', 3600))"
    )


def mfu_words(mfu_percent: float, model: str | None = None) -> str:
    """A measured MFU in whole tenths, rounded half up on the tenths (the pipeline's QuoteRun writes the same:
    $floor(m * 10 + 0.5) / 10), so the CLI and the pipeline never differ at a halfway value; `model`: measured on
    that model size's runs, not on every run of the environment."""
    measured = f"MFU {math.floor(mfu_percent * 10 + 0.5) / 10:.1f}% measured"
    return f"{measured} on {model} runs" if model else measured


@dataclass(frozen=True)
class QuoteTerms:
    """What an environment's quote needs from its configuration: prices per hour (None: none known)."""

    environment: str
    peak_tflops_per_worker: float  # a GPU's, or one NeuronCore's share of its chip's (one worker per core)
    node_usd_per_hour: float | None  # 0.0 on reserved capacity
    validation_usd_per_hour: float | None
    sanity_separate: bool  # a sanity job of its own (Batch, EKS), not inside the training job (SageMaker)
    compiles_ahead: bool  # a compile job of its own before training (Trainium)
    price_basis: str  # where node_usd_per_hour comes from, in words
    budget_name: str

    @property
    def other_node_hours(self) -> float:
        """Hours on the run's nodes besides training: the sanity and compile jobs, where they are jobs of their own."""
        minutes = (SANITY_MINUTES if self.sanity_separate else 0) + (COMPILE_MINUTES if self.compiles_ahead else 0)
        return minutes / 60

    @classmethod
    def of(cls, config: EnvironmentConfig) -> QuoteTerms:
        sagemaker = config.compute == "sagemaker"
        instance, single = config.instance, config.single_node_instance
        node = instance.sagemaker_usd_per_hour if sagemaker else instance.on_demand_usd_per_hour
        basis = _on_demand_basis(config)
        if sagemaker and (instance.sagemaker_price_estimated or single.sagemaker_price_estimated):
            # No recorded ml.* list price for the type (config/catalogue.py): the quote says its price is an estimate.
            basis = f"SageMaker on-demand, an estimate: EC2's price x {SAGEMAKER_ESTIMATE_RATIO}"
        if config.reservation is not None:
            node, basis = 0.0, "reserved capacity, paid for whether used or not"
        return cls(
            environment=config.name,
            peak_tflops_per_worker=instance.peak_bf16_tflops_per_accelerator / instance.cores_per_accelerator,
            node_usd_per_hour=node,
            validation_usd_per_hour=single.sagemaker_usd_per_hour if sagemaker else single.on_demand_usd_per_hour,
            sanity_separate=not sagemaker,
            compiles_ahead=instance.accelerator is Accelerator.NEURON,
            price_basis=basis,
            budget_name=config.budget_name,
        )


def _on_demand_basis(config: EnvironmentConfig) -> str:
    """The price the quote takes, and where Spot would cost less: never for Batch's multi-node jobs, which Batch runs
    on demand only (the README's backend table), so the quote says nothing of Spot there."""
    if config.compute == "sagemaker":
        return "SageMaker on-demand" + ("; managed Spot costs less" if config.sagemaker_spot else "")
    return "EC2 on-demand" + ("; the Spot node group costs less" if config.eks_capacity_type == "spot" else "")


@dataclass(frozen=True)
class Quote:
    usd: float | None  # None: no estimate (basis says why)
    hours: float | None
    basis: str

    def line(self) -> str:
        if self.usd is None:
            return f"quote: no estimate ({self.basis})"
        return f"quote: {about_usd(self.usd)} for {_duration(self.hours or 0)} of training ({self.basis})"


def _two_figures(value: float) -> float:
    return float(f"{value:.2g}")


def _duration(hours: float) -> str:
    if hours >= 1:
        return f"~{_two_figures(hours):g} h"
    return f"~{_two_figures(hours * 60):g} min" if hours * 60 >= 1 else "under a minute"


def about_usd(value: float) -> str:
    """An estimate in dollars: two significant figures, marked ~ (never to the cent)."""
    rounded = _two_figures(value)
    return f"~${rounded:,.0f}" if rounded >= 10 else f"~${rounded:g}"


def quote(
    run: dict,
    terms: QuoteTerms,
    measured_mfu_percent: float | None = None,
    measured_on_model: bool = False,
    workloads: WorkloadSchemas | None = None,
) -> Quote:
    """The quote of a validated run (defaults filled in) by its workload's cost model (`workloads`: an environment's
    declared ones; the built-in ones always); `measured_on_model`: the measured MFU is that of the runs of the run's
    own model size (else of every run of the environment)."""
    params = run.get("hyperparameters", {})
    schema = known_workloads(workloads).get(run.get("workload", DEFAULT_WORKLOAD))
    cost = schema.cost if schema else None
    tflops = cost.sample_tflops(params) if cost else None
    if cost is None or tflops is None:
        return Quote(None, None, "no FLOPs model for this workload")
    if terms.node_usd_per_hour is None or terms.validation_usd_per_hour is None:
        return Quote(None, None, "no price known for this environment's instance types")
    mfu = measured_mfu_percent or ASSUMED_MFU_PERCENT
    step = params[cost.batch_size] * tflops / (cost.split(params) * terms.peak_tflops_per_worker * mfu / 100)
    step *= cost.bubble(params)
    hours = params[cost.steps] * step / 3600
    node_hours = run["nodes"] * (hours + terms.other_node_hours)
    usd = node_hours * terms.node_usd_per_hour + VALIDATION_MINUTES / 60 * terms.validation_usd_per_hour
    on = cost.size(params) if measured_on_model else None
    measured = mfu_words(mfu, on) if measured_mfu_percent else f"MFU {mfu:g}% assumed"
    return Quote(usd, hours, f"{measured}, {terms.price_basis}")


def priced_model(run: dict, workloads: WorkloadSchemas | None = None) -> str | None:
    """The model size a validated run trains, by its workload's cost model (the value of its `by` hyperparameter),
    whose own measured MFU its quote prefers; None where the cost model has no sizes."""
    schema = known_workloads(workloads).get(run.get("workload", DEFAULT_WORKLOAD))
    return schema.cost.size(run.get("hyperparameters", {})) if schema and schema.cost else None


def unread_budget_refusal(budget_name: str, why: str) -> str:
    """Why a run is refused when its budget cannot be read (issue 47: an unreadable budget passed every run). The
    pipeline's BudgetNotRead state (constructs/pipeline/run_quote.py) writes the same line, `why` its error's name."""
    return f"the monthly budget {budget_name} could not be read ({why}); set may_exceed_budget: true to run without it"


def budget_refusal(q: Quote, limit_usd: float, actual_usd: float) -> str | None:
    """Why a run is refused for the monthly budget (one line), or None. Without an estimate, only a spent budget.
    The pipeline's CompareQuoteWithBudget state (constructs/pipeline/run_quote.py) writes the same line."""
    left = limit_usd - actual_usd
    spent = f"AWS Budgets: ${actual_usd:,.2f} of ${limit_usd:,.2f} spent this month"
    if q.usd is None and left <= 0:
        return f"the monthly budget is spent ({spent}); set may_exceed_budget: true to run anyway"
    if q.usd is not None and q.usd > max(left, 0):  # a run quoted at nothing is never refused
        return (
            f"the run is quoted at ~${q.usd:,.0f} but the monthly budget has ${max(left, 0):,.2f} left ({spent}); "
            "lower max_steps or nodes, or set may_exceed_budget: true"
        )
    return None
