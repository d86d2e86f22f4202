"""The README's instance catalogue table, rendered from config/catalogue.py (a test holds the README to it).

.venv/bin/python -m tools.catalogue_table    # print the table to paste into README.md
"""

from config.catalogue import CATALOGUE, PRICE_DATE, InstanceType

HEADER = (
    "| type | accelerators | vCPUs / memory | EFA interfaces / network cards | network | peak bf16 per accelerator "
    "| workers per node | EC2 on-demand (us-east-1, " + PRICE_DATE + ") | SageMaker training | sanity-check busbw "
    "(2 GiB) | validates on |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def _price(it: InstanceType) -> str:
    return "none listed (Capacity Blocks)" if it.on_demand_usd_per_hour is None else f"${it.on_demand_usd_per_hour:g}"


def _sagemaker(it: InstanceType) -> str:
    if not it.sagemaker_offered:
        return "not offered"
    price = it.sagemaker_usd_per_hour
    if price is None:
        return f"{it.sagemaker_instance_type}, price unknown"
    return f"{it.sagemaker_instance_type}, ${price:g}" + (" (estimate)" if it.sagemaker_price_estimated else "")


def _busbw(it: InstanceType) -> str:
    if not it.has_efa:
        return "single-node"
    rule = "80% of published" if it.published_busbw_gbps is not None else "half line rate"
    return f"{it.expected_busbw_gbps:g} GB/s ({rule})"


def row(it: InstanceType) -> str:
    cards = f"{it.efa_interfaces} / {max(it.network_cards, 1)}" if it.has_efa else "none used"
    return (
        f"| `{it.name}` | {it.accelerators} x {it.accelerator_model} | {it.vcpus} / {it.memory_gib} GiB | {cards} "
        f"| {it.network_gbps:g} Gbps | {it.peak_bf16_tflops_per_accelerator:g} TFLOPS | {it.workers_per_node} "
        f"| {_price(it)} | {_sagemaker(it)} | {_busbw(it)} | {it.validation_instance_type or '-'} |"
    )


def notes() -> str:
    """Per type: where its bandwidth threshold and (where it differs from the list) its price come from."""
    return "\n".join(
        f"- `{it.name}`: busbw {it.busbw_source}" + (f"; price: {it.price_note}" if it.price_note else "")
        for it in CATALOGUE.values()
        if it.has_efa
    )


def table() -> str:
    return "\n".join([HEADER, *(row(it) for it in CATALOGUE.values())]) + "\n\n" + notes()


if __name__ == "__main__":
    print(table())
