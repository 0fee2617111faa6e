"""gpu-alert-bot: turns Alertmanager webhooks into precise, never-lost notifications for GPU servers."""
