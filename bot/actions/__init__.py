"""Remediation: the actions playbooks name, run on targets the configuration lists, behind safety rails
(dry-run, approval, cooldown, concurrency limit, circuit breaker), persisted, audited, announced and verified.
See docs/remediation.md."""
