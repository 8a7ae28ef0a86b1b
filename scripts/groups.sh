# Sourced by scripts/demo.sh: start commands in sessions of their own and stop every one of them,
# whenever the script is interrupted. Bash runs a trap between two commands, so a signal that
# lands just after `cmd &` would run the script's exit trap before the new pid was written down,
# and the command it started would outlive the script. `launch` takes the signal, writes the pid
# down, then acts on it.
groups=()

group_alive() {  # any process of group $1 that is not a zombie
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {found = 1} END {exit !found}'
}

launch() {  # LOG CMD...: CMD in a session of its own, its output in LOG
  local held=
  trap 'held=130' INT
  trap 'held=143' TERM
  setsid "${@:2}" >"$1" 2>&1 </dev/null &
  groups+=($!)
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [ -n "$held" ]; then exit "$held"; fi
}

stop_groups() {  # TERM to every group, KILL to what is left after 20 s; returns once all are gone
  # Each group, and its leader by pid: stopped before its `setsid` ran, it has no group yet.
  local pgid signal alive
  for signal in TERM KILL; do
    for pgid in "${groups[@]}"; do kill "-$signal" -- "-$pgid" "$pgid" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
      alive=0
      for pgid in "${groups[@]}"; do
        { group_alive "$pgid" || kill -0 "$pgid" 2>/dev/null; } && alive=1
      done
      [ "$alive" = 0 ] && return 0
      sleep 0.2
    done
  done
}
