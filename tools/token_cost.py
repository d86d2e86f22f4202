"""The price of a billion training tokens on each catalogue training type: the comparison of GPU and Trainium
that a cost per hour cannot make.

    tokens/s per node  = MFU x accelerators x peak bf16 FLOP/s per accelerator / training FLOPs per token
    $ per 1e9 tokens   = $ per node-hour / (tokens/s per node x 3600) x 1e9

Training FLOPs per token are the training image's own (training_image/efa_training/workloads/gpt/sizes.py: 6N for the
matmuls plus the attention term, PaLM appendix B), the peak is the catalogue's, and the node count cancels out (linear
scaling assumed: communication overhead is part of the MFU). MFU is an assumption, DEFAULT_MFU_PERCENT unless given;
where an environment's runs have reported MFU (the EfaTraining namespace's MFU metric, over the last MEASURED_DAYS
days), the report prices that environment's type at the measured figure as well. The image measures MFU on CUDA only.
"""

import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.exceptions import BotoCoreError, ClientError

from config import CATALOGUE, EnvironmentConfig, InstanceType
from config.catalogue import CAPACITY_BLOCKS_ONLY, SAGEMAKER_ESTIMATE_RATIO, SAGEMAKER_SPOT_MAX_SAVING
from contracts.quote import ASSUMED_MFU_PERCENT, MEASURED_DAYS, about_usd, measured_mfu_query
from tools.cost_report import ROOT

sys.path.insert(0, str(ROOT / "training_image"))  # the training image's package, efa_training
from efa_training.workloads.gpt.sizes import MODEL_SIZES, flops_per_token  # noqa: E402

DEFAULT_MFU_PERCENT = ASSUMED_MFU_PERCENT  # the quote's assumption (contracts/quote.py); --mfu or a measured one
DEFAULT_MODEL = "1.3b"
BILLION = 1e9


@dataclass(frozen=True)
class TokenCost:
    instance: InstanceType
    tokens_per_second: float  # per node
    ec2_usd: float | None  # per billion tokens, EC2 on-demand; None where EC2 lists no on-demand price
    sagemaker_usd: float | None  # SageMaker on-demand; None where SageMaker does not train on the type
    spot_usd: float | None  # EC2 Spot, where a live price was found


def tokens_per_second(instance: InstanceType, model: str, mfu_percent: float) -> float:
    peak = instance.accelerators * instance.peak_bf16_tflops_per_accelerator * 1e12
    return mfu_percent / 100 * peak / flops_per_token(MODEL_SIZES[model])


def usd_per_billion_tokens(usd_per_node_hour: float, node_tokens_per_second: float) -> float:
    return usd_per_node_hour / (node_tokens_per_second * 3600) * BILLION


def token_cost(instance: InstanceType, model: str, mfu_percent: float, spot_usd_per_hour: float | None) -> TokenCost:
    tps = tokens_per_second(instance, model, mfu_percent)
    sagemaker = instance.sagemaker_usd_per_hour
    return TokenCost(
        instance=instance,
        tokens_per_second=tps,
        ec2_usd=None
        if instance.on_demand_usd_per_hour is None
        else usd_per_billion_tokens(instance.on_demand_usd_per_hour, tps),
        sagemaker_usd=None if sagemaker is None else usd_per_billion_tokens(sagemaker, tps),
        spot_usd=None if spot_usd_per_hour is None else usd_per_billion_tokens(spot_usd_per_hour, tps),
    )


def training_types() -> list[InstanceType]:
    return [it for it in CATALOGUE.values() if it.has_efa and not it.single_node_only]


def live_spot_prices(ec2_client, names: list[str]) -> dict[str, float]:
    """The newest Linux Spot price of each type in the client's region (the highest across its zones)."""
    found: dict[tuple[str, str], float] = {}
    response = ec2_client.describe_spot_price_history(
        InstanceTypes=names, ProductDescriptions=["Linux/UNIX"], StartTime=datetime.now(UTC), MaxResults=1000
    )
    for entry in response.get("SpotPriceHistory", []):  # newest first per type and zone
        found.setdefault((entry["InstanceType"], entry["AvailabilityZone"]), float(entry["SpotPrice"]))
    prices: dict[str, float] = {}
    for (name, _), price in found.items():
        prices[name] = max(price, prices.get(name, 0.0))
    return prices


def measured_mfu(cloudwatch_client, environment: str) -> float | None:
    """The environment's runs' average reported MFU over the last MEASURED_DAYS days, or None if none reported."""
    return measured_mfus(cloudwatch_client, environment, None)[0]


def measured_mfus(cloudwatch_client, environment: str, model: str | None) -> tuple[float | None, bool]:
    """(MFU, whether it is `model`'s): the mean MFU the environment's runs of `model` reported over the last
    MEASURED_DAYS days, else that of all its runs, else None; one GetMetricData call, as the pipeline's
    ReadMeasuredMfu asks (contracts.quote.measured_mfu_query)."""
    end = datetime.now(UTC)
    queries = {
        "env": measured_mfu_query(environment),
        **({"model": measured_mfu_query(environment, model)} if model else {}),
    }
    response = cloudwatch_client.get_metric_data(
        MetricDataQueries=[{"Id": key, "Expression": query, "ReturnData": True} for key, query in queries.items()],
        StartTime=end - timedelta(days=MEASURED_DAYS),
        EndTime=end,
    )
    found = {key: [v for r in response.get("MetricDataResults", []) if r.get("Id") == key for v in r.get("Values", [])]
             for key in queries}  # fmt: skip
    for key in ("model", "env"):
        if found.get(key):
            return sum(found[key]) / len(found[key]), key == "model"
    return None, False


def _usd(value: float | None, estimated: bool = False) -> str:
    """A price read from a list to the cent; an estimated one (SageMaker's EC2 x ratio) as contracts.quote rounds it."""
    if value is None:
        return "n/a"
    return about_usd(value) if estimated else f"${value:,.2f}"


def render(model: str, mfu_percent: float, costs: list[TokenCost], spot_note: str) -> str:
    lines = [
        f"Price of a billion training tokens, model {model} ({flops_per_token(MODEL_SIZES[model]):.3g} FLOPs per "
        f"token), MFU {mfu_percent:g}% (assumed; --mfu to change):",
        f"  {'type':<16} {'tokens/s/node':>14} {'EC2':>11} {'EC2 Spot':>11} {'SageMaker':>11} {'SM Spot from':>13}",
    ]
    for c in costs:
        best = None if c.sagemaker_usd is None else c.sagemaker_usd * (1 - SAGEMAKER_SPOT_MAX_SAVING)
        lines.append(
            f"  {c.instance.name:<16} {c.tokens_per_second:>14,.0f} {_usd(c.ec2_usd):>11} {_usd(c.spot_usd):>11} "
            f"{_usd(c.sagemaker_usd, c.instance.sagemaker_price_estimated):>11} "
            f"{_usd(best, c.instance.sagemaker_price_estimated):>13}"
        )
    lines.append(
        f"  EC2 Spot: {spot_note}. SM Spot from: SageMaker managed Spot at AWS's best case, up to "
        f"{SAGEMAKER_SPOT_MAX_SAVING:.0%} off (AWS's maximum saving, not a typical price). "
        f"~: an estimate, SageMaker's price taken as EC2's x {SAGEMAKER_ESTIMATE_RATIO} (no recorded ml.* price). "
        f"n/a: no price known ({CAPACITY_BLOCKS_ONLY}). Formula: tools/token_cost.py."
    )
    return "\n".join(lines)


def report(
    configs: list[EnvironmentConfig], model: str, mfu_percent: float, session=None, has_credentials: bool = False
) -> str:
    """The table for every training type, then each environment's type at its measured MFU where there is one."""
    names = [it.name for it in training_types()]
    spot: dict[str, float] = {}
    spot_note = "needs credentials"
    if has_credentials and configs:
        region = configs[0].region
        try:
            spot = live_spot_prices(session.client("ec2", region_name=region), names)
            spot_note = f"live, {region}, now"
        except (BotoCoreError, ClientError) as error:
            spot_note = f"Spot price history failed: {error}"
    blocks = [
        render(
            model, mfu_percent, [token_cost(CATALOGUE[n], model, mfu_percent, spot.get(n)) for n in names], spot_note
        )
    ]
    if has_credentials:
        for config in configs:
            try:
                measured = measured_mfu(session.client("cloudwatch", region_name=config.region), config.name)
            except (BotoCoreError, ClientError) as error:
                blocks.append(f"  {config.name}: measured MFU not read ({error})")
                continue
            if measured:
                cost = token_cost(config.instance, model, measured, spot.get(config.instance_type))
                blocks.append(
                    f"  {config.name}: measured MFU {measured:.1f}% on {config.instance_type} (last {MEASURED_DAYS} "
                    f"days): EC2 {_usd(cost.ec2_usd)}, SageMaker "
                    f"{_usd(cost.sagemaker_usd, config.instance.sagemaker_price_estimated)} per billion tokens"
                )
    return "\n".join(blocks)
