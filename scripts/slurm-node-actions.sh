#!/bin/sh
# The scheduler side of gpu-alert-bot's Slurm access: the forced command of the bot's key on a host whose
# scontrol reaches slurmctld (the controller, or a login node), as an account Slurm lets update nodes.
#
#   authorized_keys of that account (one line):
#   restrict,command="/usr/local/sbin/slurm-node-actions.sh /etc/slurm-node-actions.conf" ssh-ed25519 AAAA... gpu-alert-bot
#
# The bot sends one of these requests; anything else is refused with exit status 64:
#   drain NODE REASON    scontrol update NodeName=NODE State=DRAIN Reason="REASON" (running jobs finish)
#   resume NODE          scontrol update NodeName=NODE State=RESUME
#   node NODE            one line NODE|STATE|REASON (sinfo) for that node
#   nodes                the same line for every node
#   jobs                 squeue --json (the bot keeps the running jobs and the node and GPUs each holds)
# NODE is one node name (no host list: no brackets, no commas); REASON is words the bot composes (the alert's
# name and id, the run number). The config file (optional, shell variables) restricts what this key may do:
# VERBS (the requests allowed, e.g. "node nodes jobs" for a read-only key), NODES (the node names it may drain
# and resume; empty: any), and names SLURM_CONF, the tools and LOG_FILE. See docs/remediation.md.
set -eu

config=${1:-/etc/slurm-node-actions.conf}
SCONTROL=scontrol
SINFO=sinfo
SQUEUE=squeue
VERBS="drain resume node nodes jobs"
NODES=
LOG_FILE=
SLURM_CONF=${SLURM_CONF:-}
# shellcheck disable=SC1090
[ -r "$config" ] && . "$config"
[ -n "$SLURM_CONF" ] && export SLURM_CONF

log() {
    if [ -n "$LOG_FILE" ]; then
        printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >>"$LOG_FILE"
    else
        logger -t slurm-node-actions -- "$*" || true
    fi
}

refuse() {
    log "refused: $1"
    echo "slurm-node-actions: $1" >&2
    exit 64
}

request=${SSH_ORIGINAL_COMMAND:-}
case "$request" in
    *"
"*) refuse "a request is one line" ;;
esac
verb=${request%% *}
rest=
[ "$verb" != "$request" ] && rest=${request#* }
node=${rest%% *}
reason=
[ "$node" != "$rest" ] && reason=${rest#* }

allowed=no
for permitted in $VERBS; do
    [ "$permitted" = "$verb" ] && allowed=yes
done
case "$verb" in
    drain | resume | node | nodes | jobs) ;;
    *) refuse "unknown verb '$verb'" ;;
esac
[ "$allowed" = yes ] || refuse "verb '$verb' is not allowed to this key (VERBS in $config)"

node_name() {
    case "$node" in
        "" | -* | *[!A-Za-z0-9_.-]*) refuse "$verb needs one node name, got '$node'" ;;
    esac
    [ "${#node}" -le 64 ] || refuse "node name too long"
}

may_change() {
    [ -z "$NODES" ] && return 0
    for permitted in $NODES; do
        [ "$permitted" = "$node" ] && return 0
    done
    refuse "node '$node' is not one this key may change (NODES in $config)"
}

no_argument() {
    [ -z "$rest" ] || refuse "$verb takes no argument"
}

log "verb: $request"
case "$verb" in
    drain)
        node_name
        may_change
        case "$reason" in
            "" | *[!A-Za-z0-9\ _.:#/-]*) refuse "drain needs a reason of letters, digits and ' _.:#/-'" ;;
        esac
        [ "${#reason}" -le 200 ] || refuse "reason too long"
        "$SCONTROL" update NodeName="$node" State=DRAIN Reason="$reason"
        ;;
    resume)
        node_name
        may_change
        [ -z "$reason" ] || refuse "resume takes only a node name"
        "$SCONTROL" update NodeName="$node" State=RESUME
        ;;
    node)
        node_name
        [ -z "$reason" ] || refuse "node takes only a node name"
        "$SINFO" -h -N -n "$node" -o '%N|%T|%E'
        ;;
    nodes)
        no_argument
        "$SINFO" -h -N -o '%N|%T|%E'
        ;;
    jobs)
        no_argument
        "$SQUEUE" --json
        ;;
esac
