"""The one place for FSx for Lustre prices and the billing conventions the cost report uses.

EC2 prices live with the other instance facts in config/catalogue.py. These are list prices for
SSD storage in us-east-1; other regions may differ. With AWS credentials `tools.cost_report`
prefers the live Price List API for EC2 and says so in its output.
"""

from types import MappingProxyType

FSX_PRICE_SOURCE = "AWS FSx for Lustre list prices, us-east-1, SSD storage (recorded, not re-checked)"
FSX_PRICE_DATE = "2025-05-31"

# USD per GB-month of provisioned storage. SCRATCH_2 has no throughput tier (200 MB/s/TiB burst is
# included); PERSISTENT_2 is priced by its per-TiB throughput tier (config.environment.FSX_THROUGHPUTS_PER_TIB).
FSX_USD_PER_GB_MONTH: MappingProxyType = MappingProxyType(
    {
        ("SCRATCH_2", None): 0.140,
        ("PERSISTENT_2", 125): 0.145,
        ("PERSISTENT_2", 250): 0.210,
        ("PERSISTENT_2", 500): 0.340,
        ("PERSISTENT_2", 1000): 0.600,
    }
)

# AWS prices a month as 730 hours (365 days x 24 h / 12) when it converts hourly and monthly rates.
HOURS_PER_MONTH = 730


def fsx_usd_per_gb_month(deployment_type: str, throughput_per_tib: int) -> float:
    """The storage price for a deployment type and (for persistent file systems) throughput tier."""
    tier = throughput_per_tib if deployment_type.startswith("PERSISTENT") else None
    try:
        return FSX_USD_PER_GB_MONTH[(deployment_type, tier)]
    except KeyError:
        raise KeyError(
            f"no FSx price for {deployment_type} at {throughput_per_tib} MB/s/TiB; "
            f"add it to config/pricing.py (known: {sorted(FSX_USD_PER_GB_MONTH, key=str)})"
        ) from None
