#!/usr/bin/env bash
# A training-like job that follows trnflow's protocol for real jobs: it resumes from its
# checkpoint when TRNFLOW_RESUME=1, reports `::progress`, writes a checkpoint every EVERY
# steps (`::checkpoint PATH`), and at the spot notice (SIGTERM) checkpoints and exits.
# Each attempt appends to $TRNFLOW_RUN_DIR/steps.log what it did, for tests to inspect.
# HOLD_AT=N (tests): the first attempt stops after step N and waits there to be killed, so a
# test kills it at a known point (after its last checkpoint, before the next).
set -u
steps=${STEPS:-40}
every=${EVERY:-5}
state="$TRNFLOW_CHECKPOINT_DIR/state"
step=0
if [ "${TRNFLOW_RESUME:-0}" = 1 ] && [ -f "$state" ]; then
  step=$(cat "$state")
  echo "resuming from step $step"
fi
echo "attempt $TRNFLOW_ATTEMPT starts at step $step" >> "$TRNFLOW_RUN_DIR/steps.log"

save() {
  echo "$step" > "$state.tmp" && mv "$state.tmp" "$state"
  echo "::progress $(awk -v s="$step" -v n="$steps" 'BEGIN { print s / n }')"
  echo "::checkpoint $state"
}
trap 'save; echo "notice received: saved step $step"; exit 143' TERM

while [ "$step" -lt "$steps" ]; do
  sleep 0.05 & wait $!  # wait in the shell so the TERM trap runs at once
  # Logged before it counts: a notice between the two commands must not checkpoint a step
  # the log never saw (the trap runs between any two commands).
  echo "step $((step + 1))" >> "$TRNFLOW_RUN_DIR/steps.log"
  step=$((step + 1))
  if [ $((step % every)) -eq 0 ]; then save; fi
  if [ "$step" = "${HOLD_AT:-}" ] && [ "${TRNFLOW_ATTEMPT:-1}" = 1 ]; then
    echo "holding at step $step"
    while :; do sleep 1 & wait $!; done
  fi
done
echo "::progress 1"
echo "done at step $step"
