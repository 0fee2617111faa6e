"""The running service: the aiohttp application, the ingest and worker roles, the supervised worker process, its
wake-up and heartbeat."""
