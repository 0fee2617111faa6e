"""What the bot knows of NVIDIA GPUs, apart from any one alert: the kernel's NVRM lines (Xid, NVLink), the Xid
catalog and the escalation rules for recurring Xids."""
