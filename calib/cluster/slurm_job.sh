#!/bin/bash
@sbatch_lines@
#
# Written by `python -m calib.cluster slurm` for the study command:
#   @study@
# Submit: sbatch @script_path@    Follow: tail -f @log_dir@/@name@-<job id>.out
# Cancel: scancel <job id>    What it does: docs/how-to/slurm.md.
# shellcheck disable=SC1090,SC1091  # the setup lines may source the site's files, which shellcheck cannot follow
set -uo pipefail

RUN_DIR=@run_dir@
LOG_DIR="$RUN_DIR/slurm"
MAX_REQUEUES=@max_requeues@
INTERRUPTED=@interrupted@
FAILED=@failed@
RESTARTS=${SLURM_RESTART_COUNT:-0}
say() { echo "[calib-slurm $(date +%H:%M:%S)] $*"; }
say "job $SLURM_JOB_ID, start $((RESTARTS + 1)) of at most $((MAX_REQUEUES + 1)), nodes $SLURM_JOB_NODELIST"
if (( RESTARTS > MAX_REQUEUES )); then
  say "not run: started more often than the $MAX_REQUEUES requeues allowed; the study is not finished:" \
    "submit this script again to continue it"
  exit $INTERRUPTED
fi
# Slurm's warning before the time limit (USR1): the study stops cleanly, the job requeues itself.
# SIGTERM (scontrol requeue, a preemption, scancel, the time limit): Slurm is ending the job and kills whatever
# is left KillWait seconds later. Until the study starts, only remembered.
SIGNALLED=""
ENDING=""
CHILD=""     # what the script waits for: the wait for Ray's nodes, then the study; a signal stops it
DEADLINE=""  # after SIGTERM: when the script ends the child itself, before Slurm's SIGKILL (KillWait) ends all
# Slurm kills what is left KillWait seconds after its SIGTERM: the script waits that long less a margin for the
# study's last line, then ends the study itself, so that its own last line is always written.
KILL_WAIT=$(timeout 5 scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9][0-9]*\).*/\1/p')
KILL_WAIT=${KILL_WAIT:-30}
MARGIN=3
# Why Slurm sent SIGTERM, from its record of the job: a requeue counts one more restart, the time limit is the
# reason; a job still running was only signalled (scancel --signal=TERM); any other was cancelled.
# shellcheck disable=SC2317  # called from on_signal, which the traps below call
why_sigterm() {
  local record
  record=$(timeout 2 scontrol show job "$SLURM_JOB_ID" 2>/dev/null) || { echo unknown; return; }
  if [[ $record =~ Restarts=([0-9]+) ]] && (( BASH_REMATCH[1] > RESTARTS )); then echo requeued
  elif [[ $record == *Reason=TimeLimit* ]]; then echo time-limit
  elif [[ $record == *JobState=RUNNING* ]]; then echo signalled
  else echo cancelled; fi
}
# shellcheck disable=SC2317  # called by the traps below
on_signal() {
  SIGNALLED=$1
  [[ -n $CHILD ]] && kill -TERM "$CHILD" 2>/dev/null
  if [[ $1 == USR1 ]]; then
    say "USR1: stopping the study cleanly"
    return
  fi
  DEADLINE=$((SECONDS + (KILL_WAIT > MARGIN + 1 ? KILL_WAIT - MARGIN : 1)))
  ENDING=$(why_sigterm)
  case $ENDING in
    requeued) say "SIGTERM: Slurm requeued the job (scontrol requeue or a preemption); stopping the study" ;;
    time-limit) say "SIGTERM: the job reached its time limit; stopping the study" ;;
    cancelled) say "SIGTERM: Slurm cancelled the job (scancel, or a preemption that cancels); stopping the study" ;;
    *) say "SIGTERM: stopping the study" ;;
  esac
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM
# Runs "$@" in the background and waits for it (a command in the foreground would hold a trapped signal until it
# ended); after SIGTERM, until DEADLINE at most, then ends it and says so. Its exit status.
run_child() {
  "$@" &
  CHILD=$!
  while kill -0 "$CHILD" 2>/dev/null; do
    if [[ -z $DEADLINE ]]; then
      { wait "$CHILD"; } 2>/dev/null  # returns early when a trapped signal arrives: the child is then still stopping
    elif (( SECONDS >= DEADLINE )); then
      say "the study did not stop within $((KILL_WAIT > MARGIN + 1 ? KILL_WAIT - MARGIN : 1)) s of the SIGTERM" \
        "(Slurm's KillWait, $KILL_WAIT s, less $MARGIN s for this script to end): this script ended it (SIGKILL)"
      kill -KILL "$CHILD" 2>/dev/null
      { wait "$CHILD"; } 2>/dev/null  # at once, so that bash does not report the child it killed ("Killed")
      return
    else
      sleep 0.2 & wait $!
    fi
  done
  # The child's own exit status, which bash keeps (a wait a signal cut short gives 128+signal); bash's report of a
  # child a signal ended ("Aborted") is not the script's to print: its own lines say how the child ended.
  { wait "$CHILD"; } 2>/dev/null
}

@setup@
cd "$RUN_DIR" || { say "the run directory $RUN_DIR is not reachable on $(hostname)"; exit $FAILED; }

# Node addresses from Slurm: `hostname --ip-address` gives 127.0.0.1 on many nodes.
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
node_addr() { scontrol show node "$1" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p'; }
HEAD_IP=$(node_addr "${NODES[0]}")
# calib on every node before Ray starts, imported as the study imports it (not from the current folder): a node whose
# python cannot (a Python or checkout it does not see, such as one under another node's /tmp) ends the job at once.
# shellcheck disable=SC2016  # expanded by bash -c on each node
CHECK_NODE='error=$(python -c "import sys; sys.path[:] = [p for p in sys.path if p]; import calib" 2>&1) ||
  echo "$SLURMD_NODENAME $(command -v python || echo python) $(tail -n 1 <<<"$error")"'
UNFIT=$(srun --overlap --nodes=${#NODES[@]} --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c "$CHECK_NODE" 2>/dev/null |
  head -n 1)
if [[ -n $UNFIT ]]; then
  read -r UNFIT_NODE UNFIT_PYTHON UNFIT_ERROR <<<"$UNFIT"
  say "calib does not import on node $UNFIT_NODE with $UNFIT_PYTHON ($UNFIT_ERROR): install calib where every node" \
    "sees it (the cluster's shared file system) and make the setup lines (--setup) put that Python on the PATH"
  exit $FAILED
fi

# Ray's ports from the job id: two jobs on one node never share them. Its folder on each node: made by the node's
# step (mktemp -d: created atomically, mode 0700, a name no one can take first), $RAY_TMP.XXXXXXXX, with Ray's
# temporary folder inside, ray/ (which Ray makes 0777 itself): no other user can traverse into it (its sockets,
# logs, the plugins Ray unpacks); its socket paths stay under 107 bytes whatever $TMPDIR is.
BASE=@port_base@
RAY_TMP=@ray_tmp@/calib-$SLURM_JOB_ID
PORTS="--node-manager-port=$((BASE + 1)) --object-manager-port=$((BASE + 2))
  --dashboard-agent-grpc-port=$((BASE + 4)) --dashboard-agent-listen-port=$((BASE + 5))
  --metrics-export-port=$((BASE + 6)) --runtime-env-agent-port=$((BASE + 7))
  --min-worker-port=$((BASE + 20)) --max-worker-port=@max_worker_port@"
# Ray's client server (10001 by default) runs when its dependency is installed: on the job's port then.
CLIENT=""
python -c 'import grpc' 2>/dev/null && CLIENT="--ray-client-server-port=$((BASE + 3))"

# Token authentication, explicit and the same on every node and the driver.
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$LOG_DIR/.ray-token-$SLURM_JOB_ID" RAY_USAGE_STATS_ENABLED=0
# Ray stops at once on SIGTERM: its drain (up to 30 s, for Ray Serve) would outlast a short KillWait.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
# With Ray's dashboard dependencies (ray[default]) the head's dashboard process (headless here) serves Prometheus
# metrics, on 44227 for every job of the node unless told: the job's own port instead.
export DASHBOARD_METRIC_PORT=$((BASE + 8))
(umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH") & wait $!
export CALIB_STAGE1_HANDOVER_SECONDS=${CALIB_STAGE1_HANDOVER_SECONDS:-@handover_seconds@}
CPUS=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}
GPUS=${SLURM_GPUS_ON_NODE:-0}

STEPS=()
# This job's Ray only: its processes name its folder, $RAY_TMP.<8 characters> ("[/]": the pattern does not match a
# command line holding it). The steps that run them take it from the environment: stopping Ray never kills srun
# (bash would log it). RAY_LOGS: where a failed start keeps each node's Ray logs.
RAY_LOGS="$LOG_DIR/$SLURM_JOB_ID-start$((RESTARTS + 1))-ray"  # one log per node and start
export RAY_TMP RAY_LOGS RAY_PATTERN="[${RAY_TMP:0:1}]${RAY_TMP:1}[.]"
# This job's own folders on a node, never one another user made or linked there.
# shellcheck disable=SC2016  # these commands are expanded where they run (bash -c on each node)
EACH_DIR='for RAY_DIR in "$RAY_TMP".*; do [[ -d $RAY_DIR && ! -L $RAY_DIR && -O $RAY_DIR ]] || continue; '
# A node's Ray folder goes after its processes (those left are ended: a worker still writing its last log can
# outlast the raylet a moment); the pattern names that folder only: other nodes' Ray is not this node's to end.
# shellcheck disable=SC2016
REMOVE_DIR='mine="[${RAY_DIR:0:1}]${RAY_DIR:1}"; pkill -TERM -f -- "$mine"; for _ in $(seq 10); do
  pgrep -f -- "$mine" >/dev/null || break; sleep 0.2; done; pkill -KILL -f -- "$mine"
  for _ in $(seq 10); do rm -rf -- "$RAY_DIR" 2>/dev/null; [[ -e $RAY_DIR ]] || break; sleep 0.3; done'
REMOVE_TMP="$EACH_DIR$REMOVE_DIR; done"
# A failed start's Ray logs, kept beside its log before the folder goes: <id>-start<N>-ray-<node>-logs/.
# shellcheck disable=SC2016
KEEP_LOGS="$EACH_DIR"'cp -rL -- "$RAY_DIR/ray/session_latest/logs" "$RAY_LOGS-$SLURMD_NODENAME-logs" 2>/dev/null
  done'
@mps_note@
# shellcheck disable=SC2016
STOP_NODE='pkill -TERM -f -- "$RAY_PATTERN"; for _ in $(seq 20); do pgrep -f -- "$RAY_PATTERN" >/dev/null || break
  sleep 0.5; done; pkill -KILL -f -- "$RAY_PATTERN"; @stop_mps@'"$REMOVE_TMP"
# Each node's Ray runs in a step that makes its folder and removes it when Ray ends, also when Slurm ends the step
# (cancel, preemption, requeue, time limit: the batch script can start no step then, so only the node itself can
# clean up, within Slurm's KillWait: Ray is waited for in the background, so the SIGTERM's trap runs at once, and
# what of it is left 2 s later is ended); a `ray start` that failed by itself (not stopped by a SIGTERM) keeps its
# logs in the run directory.
# shellcheck disable=SC2016
export NODE_RAY='STOPPED=""; trap "STOPPED=1" TERM
  RAY_DIR=$(mktemp -d -- "$RAY_TMP.XXXXXXXX") || { echo "no folder for Ray under ${RAY_TMP%/*}"; exit 1; }
  echo "the job'"'"'s Ray folder on $SLURMD_NODENAME: $RAY_DIR (made by the job, mode 0700)"
  @run_ray@ --temp-dir="$RAY_DIR/ray" & ray_pid=$!
  wait "$ray_pid"; rc=$?
  [[ -z $STOPPED ]] || for _ in $(seq 10); do kill -0 "$ray_pid" 2>/dev/null || break; sleep 0.2; done
  (( rc == 0 )) || [[ -n $STOPPED ]] || { '"$KEEP_LOGS"'; echo "Ray exited with $rc: its logs in" \
    "$RAY_LOGS-$SLURMD_NODENAME-logs"; }
  '"$REMOVE_DIR"'; exit $rc'
any_alive() { local pid; for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
stop_ray() {
  # After Slurm's SIGTERM every Ray process of the job has it too and stops at once (no drain), and Slurm
  # ends the steps: nothing to wait for. Otherwise SIGTERM to the steps (srun passes it to every process of
  # its step, Ray's agents included, which would outlive a raylet stopped alone), then Ray stopped and its
  # folder removed on every node.
  if [[ $SIGNALLED != TERM || $ENDING == signalled ]]; then
    kill "${STEPS[@]}" 2>/dev/null
    srun --overlap --nodes=${#NODES[@]} --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c "$STOP_NODE" >/dev/null 2>&1
    { wait "${STEPS[@]}"; } 2>/dev/null
  else  # each node's step removes its folder itself: the script waits for them, until the deadline at most
    while (( SECONDS < DEADLINE )) && any_alive "${STEPS[@]}"; do sleep 0.2 & wait $!; done
  fi
  rm -f -- "$RAY_AUTH_TOKEN_PATH"
}

say "Ray head on ${NODES[0]} ($HEAD_IP:$BASE), $((${#NODES[@]} - 1)) worker node(s); logs $RAY_LOGS-*.log"
# No autoscaler (--no-monitor): Slurm gave the job its nodes, there is nothing to scale; and Ray's autoscaler, sent
# Slurm's SIGTERM with the rest, would push its own traceback to the study's output before the job's last line.
# shellcheck disable=SC2086  # $PORTS and $CLIENT hold several flags (or none): split into words on purpose
srun --overlap --nodes=1 --ntasks=1 -w "${NODES[0]}" bash -c "$NODE_RAY" ray \
  ray start --head --block --node-ip-address="$HEAD_IP" --port=$BASE $PORTS $CLIENT \
  --num-cpus="$CPUS" --num-gpus="$GPUS" --include-dashboard=false --no-monitor \
  --disable-usage-stats@object_store@ >"$RAY_LOGS-${NODES[0]}.log" 2>&1 &
STEPS+=($!)
# Commands that a signal may kill run in the background, waited for: bash reports a foreground one killed by
# Slurm's SIGTERM ("Terminated"), never a background one while the script traps the signal.
for _ in $(seq 120); do
  [[ -n $SIGNALLED ]] && break
  (exec 3<>"/dev/tcp/$HEAD_IP/$BASE") 2>/dev/null & wait $! && break
  sleep 1 & wait $!
done
for node in "${NODES[@]:1}"; do
  [[ -n $SIGNALLED ]] && break
  # shellcheck disable=SC2086  # as above
  srun --overlap --nodes=1 --ntasks=1 -w "$node" bash -c "$NODE_RAY" ray ray start --block --address="$HEAD_IP:$BASE" \
    --node-ip-address="$(node_addr "$node")" $PORTS --num-cpus="$CPUS" --num-gpus="$GPUS" \
    --disable-usage-stats@object_store@ >"$RAY_LOGS-$node.log" 2>&1 &
  STEPS+=($!)
done
[[ -n $SIGNALLED ]] || run_child python -m calib.cluster wait --nodes ${#NODES[@]} --address "$HEAD_IP:$BASE" \
  --timeout 300
RAY_UP=$?
# A wait that a signal ended is that signal's doing: its trap may run a moment after the wait's end is seen.
(( RAY_UP > 128 )) && [[ -z $SIGNALLED ]] && { sleep 1 & wait $!; }
if (( RAY_UP != 0 )) && [[ -z $SIGNALLED ]]; then
  srun --overlap --nodes=${#NODES[@]} --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c "$KEEP_LOGS" >/dev/null 2>&1
  say "Ray did not start on every node: see $RAY_LOGS-*.log and Ray's own logs in $RAY_LOGS-<node>-logs/"
  stop_ray
  exit $FAILED
fi

RC=$INTERRUPTED
if [[ -z $SIGNALLED ]]; then
  say "study: @study@ --address $HEAD_IP:$BASE"
  run_child @study@ --address "$HEAD_IP:$BASE"
  RC=$?
fi
trap '' USR1
stop_ray
# A study that the SIGTERM itself ended (exit 143: before it listened for it, in its own start-up) or that this script
# ended at the deadline (exit 137) was stopped by the signal as a study that stops cleanly is: said, and exit 3.
if [[ -n $SIGNALLED ]] && (( RC == 143 )); then
  say "the study's process was ended by the SIGTERM itself (exit 143), in its own start-up, before it listened" \
    "for the signal: its own line is missing; nothing it had finished is lost"
  RC=$INTERRUPTED
elif [[ -n $SIGNALLED ]] && (( RC == 137 )); then
  RC=$INTERRUPTED
fi

if (( RC == 0 )); then
  say "the study finished"
  exit 0
elif (( RC == INTERRUPTED )) && [[ $SIGNALLED == USR1 ]]; then
  if (( RESTARTS < MAX_REQUEUES )); then
    say "interrupted before the time limit: the study is not finished; requeued, start $((RESTARTS + 2)) continues it"
    trap 'exit $INTERRUPTED' TERM  # the requeue's own SIGTERM ends this script, with the same exit code
    scontrol requeue "$SLURM_JOB_ID"
  else
    say "interrupted before the time limit, after $((RESTARTS + 1)) starts (no requeue left): the study is not" \
      "finished; submit this script again to continue it"
  fi
  exit $INTERRUPTED
elif [[ $SIGNALLED == TERM ]]; then
  # Slurm signals each step of a node on its own: where Ray's step had it first, Ray can end the study's
  # process (its raylet gone) before the study's own line; that exit status is Ray's, not the study's.
  (( RC == INTERRUPTED )) || say "the study's process ended with exit $RC: Ray, stopped by the same SIGTERM," \
    "ended it (the study's own line may be missing)"
  case $ENDING in
    requeued) say "the study stopped after SIGTERM: the job was requeued; start $((RESTARTS + 2)) continues it" ;;
    time-limit) say "the study stopped at the time limit, before Slurm's warning could stop it: the job is not" \
      "requeued; submit this script again, or run the same study command, to continue it" ;;
    cancelled) say "the study stopped after SIGTERM: the job was cancelled; submit this script again, or run the" \
      "same study command, to continue it" ;;
    signalled) say "the study stopped after a SIGTERM sent to the job (not a requeue): submit this script again," \
      "or run the same study command, to continue it" ;;
    *) say "the study stopped after SIGTERM (Slurm did not say why): a requeued job continues it; otherwise submit" \
      "this script again, or run the same study command" ;;
  esac
  exit $INTERRUPTED
fi
say "the study exited with $RC"
exit $RC
