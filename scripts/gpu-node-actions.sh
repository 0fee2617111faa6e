#!/bin/sh
# The remote side of gpu-alert-bot's SSH executor: the forced command of the bot's key on a GPU node.
#
#   authorized_keys of the account the bot logs in as (one line):
#   restrict,command="/usr/local/sbin/gpu-node-actions.sh /etc/gpu-node-actions.conf" ssh-ed25519 AAAA... gpu-alert-bot
#
# The bot sends a fixed verb, and for GPU actions a GPU index: `restart-dcgm-exporter`, `collect-diagnostics 3`.
# Anything else is refused. Each verb maps to one command below; the config file (optional, shell variables)
# says which container or unit is the exporter on this node. See docs/remediation.md.
set -eu

config=${1:-/etc/gpu-node-actions.conf}
DOCKER=docker
DCGM_EXPORTER_CONTAINER=dcgm-exporter
INFERENCE_CONTAINER=vllm
STOP_TIMEOUT=10
POWER_LIMIT_WATTS=
LOG_FILE=
# shellcheck disable=SC1090
[ -r "$config" ] && . "$config"

log() {
    if [ -n "$LOG_FILE" ]; then
        printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >>"$LOG_FILE"
    else
        logger -t gpu-node-actions -- "$*" || true
    fi
}

refuse() {
    log "refused: $1"
    echo "gpu-node-actions: $1" >&2
    exit 64
}

request=${SSH_ORIGINAL_COMMAND:-}
verb=${request%% *}
argument=
[ "$verb" != "$request" ] && argument=${request#* }

gpu_index() {
    case "$argument" in
        [0-9] | [0-9][0-9]) ;;
        *) refuse "$verb needs a GPU index, got '$argument'" ;;
    esac
}

no_argument() {
    [ -z "$argument" ] || refuse "$verb takes no argument"
}

log "verb: $request"
case "$verb" in
    restart-dcgm-exporter)
        no_argument
        "$DOCKER" restart -t "$STOP_TIMEOUT" "$DCGM_EXPORTER_CONTAINER"
        ;;
    restart-inference-server)
        no_argument
        "$DOCKER" restart -t "$STOP_TIMEOUT" "$INFERENCE_CONTAINER"
        ;;
    collect-diagnostics)
        gpu_index
        echo "== nvidia-smi -q -i $argument"
        nvidia-smi -q -i "$argument" 2>&1 || true
        echo "== dcgmi health -c"
        dcgmi health -c 2>&1 || true
        echo "== kernel NVRM lines"
        dmesg 2>/dev/null | grep 'NVRM:' | tail -n 20 || true
        ;;
    run-dcgm-diag)
        gpu_index
        dcgmi diag -r 1 -i "$argument"
        ;;
    lower-power-limit)
        gpu_index
        [ -n "$POWER_LIMIT_WATTS" ] || refuse "POWER_LIMIT_WATTS is not set in $config"
        nvidia-smi -i "$argument" -pl "$POWER_LIMIT_WATTS"
        ;;
    reset-gpu)
        gpu_index
        "$DOCKER" stop -t "$STOP_TIMEOUT" "$DCGM_EXPORTER_CONTAINER"
        status=0
        nvidia-smi -r -i "$argument" || status=$?
        "$DOCKER" start "$DCGM_EXPORTER_CONTAINER"
        exit "$status"
        ;;
    reboot-node)
        no_argument
        systemctl reboot
        ;;
    *)
        refuse "unknown verb '$verb'"
        ;;
esac
