# gpu-alert-bot: webhook receiver, and its worker process (worker, outbox), SQLite store in a volume.
#
#   docker build -t gpu-alert-bot .
#   docker run -d --name gpu-alert-bot -p 9095:9095 \
#     -v /srv/gpu-alert-bot/bot.yaml:/etc/gpu-alert-bot/bot.yaml:ro \
#     -v /srv/gpu-alert-bot/secrets/webhook_token:/run/secrets/webhook_token:ro \
#     -v gpu-alert-bot-data:/var/lib/gpu-alert-bot \
#     gpu-alert-bot
#
# Mounts (README, "Docker"):
#   /etc/gpu-alert-bot/bot.yaml   the configuration (read-only). The built-in one listens on 0.0.0.0:9095 but,
#                                 having no server.auth, the bot falls back to loopback: set auth to be reachable.
#   /run/secrets/NAME             each secret file named by a *_file key, mounted on its own (one -v per file, as
#                                 compose's `secrets:` does): the bot runs as uid 10001, group 10001. Give it the
#                                 file alone: `chgrp 10001` and mode 0440, or `chown 10001` and mode 0400 (a file
#                                 every user may read, 0444, works too, with a warning). Do not mount the
#                                 host's secrets directory whole: kept 0700 (config/secrets/README.md), uid 10001
#                                 cannot enter it and the bot exits 2 ("cannot read secret file ...: Permission
#                                 denied: the bot runs as uid 10001 and cannot enter /run/secrets ..."). Secrets
#                                 are never passed as environment variables: `docker inspect` would show them.
#   /var/lib/gpu-alert-bot/       the SQLite store (a volume, so acknowledged alerts survive the container).

# Stage 1 builds the wheel, which carries the bundled playbooks and Xid catalog as package data; stage 2 installs
# that wheel alone, as `pip install` would on a host: the image holds no source tree.
FROM python:3.11-slim-bookworm AS wheel

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY playbooks ./playbooks
COPY config/rules ./config/rules
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The `graphs` extra (matplotlib) draws each alert's history into its Slack thread and email.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/*.whl)[graphs]" \
    && groupadd --system --gid 10001 gpu-alert-bot \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin gpu-alert-bot \
    && mkdir -p /etc/gpu-alert-bot /var/lib/gpu-alert-bot \
    && printf '%s\n' \
        '# Built-in configuration; mount your own over it (every key: config/bot.example.yaml).' \
        'server:' \
        '  listen: 0.0.0.0:9095' \
        'store:' \
        '  path: /var/lib/gpu-alert-bot/gpu-alert-bot.db' \
        > /etc/gpu-alert-bot/bot.yaml \
    && chown gpu-alert-bot /var/lib/gpu-alert-bot

USER gpu-alert-bot
VOLUME ["/var/lib/gpu-alert-bot"]
# The webhook receiver, and the worker process's /metrics (worker.metrics_listen, docs/processes.md).
EXPOSE 9095 9096

# Asks /healthz on the port server.listen names in the configuration the bot runs with, whatever it is.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["gpu-alert-bot", "healthcheck", "--config", "/etc/gpu-alert-bot/bot.yaml", "--timeout", "4s"]

# `serve` (--role all) starts its worker process and restarts it if it dies. SIGTERM (docker stop) finishes
# requests in flight and the delivery under way, and closes the store cleanly.
CMD ["gpu-alert-bot", "serve", "--config", "/etc/gpu-alert-bot/bot.yaml"]
