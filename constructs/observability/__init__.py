"""Observability: accelerator and job metrics, the dashboard, the alarms and the monthly budget."""
