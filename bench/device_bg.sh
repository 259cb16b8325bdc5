#!/usr/bin/env bash
# A device plan longer than one call (10 minutes): start it in its own process session, so that
# it outlives the call that started it, then wait for it in the calls that follow. The device
# machine goes back 30 s after a call returns, so each wait call must follow the last at once;
# the plan dies with the machine. It runs in a copy of the checkout taken at `start`.
#
#   bash bench/device_bg.sh start 'COMMIT=<sha> OUT_DIR=/tmp/bg/out bash bench/benchmark.sh'
#   bash bench/device_bg.sh wait 560     # up to 560 s, then returns what the plan has written
#
# The plan writes what it keeps under /tmp/bg/out (give it OUT=/tmp/bg/out); `wait` packs that
# folder and the plan's log into $OUT/bg_<n>.tgz (the call returns at most 8 files; packed again
# every PACK_EVERY seconds, 60 by default, so a call cut off returns the last pack), says whether
# the plan has ended and with what exit status, and shows the log's last lines. It packs the small
# files of the runs in progress too ($SNAP, default /tmp/rw, less weights and checkpoints): a plan
# copies its runs to out/ only once a row is scored, and a machine lost before then took every log.
set -uo pipefail
BG=${DEVICE_BG_DIR:-/tmp/bg}   # the plan's folder (its log, exit status and out/)
case "${1:-}" in
start)
    [ -n "${2:-}" ] || { echo "device_bg: start needs the plan's command line" >&2; exit 2; }
    if [ -f $BG/pid ] && kill -0 "$(cat $BG/pid)" 2>/dev/null; then
        echo "device_bg: a plan is still running (pid $(cat $BG/pid)); wait for it first" >&2; exit 2
    fi
    rm -rf $BG; mkdir -p $BG/out $BG/tree
    # The plan runs in a copy of the checkout ($BG/tree, less chunk folders and any .venv): the
    # device tool re-copies the checkout at every call, and a script the plan reads from it while
    # that copy is under way may be missing.
    tar -C . --exclude=./.chunks --exclude=./.chunk --exclude=./.git --exclude=./.venv -cf - . | tar -C $BG/tree -xf - \
        || { echo "device_bg: could not copy the checkout into $BG/tree" >&2; exit 2; }
    cd $BG/tree
    # setsid: a process session of its own, which the device tool leaves running after the call.
    setsid bash -c "( $2 ); echo \$? > $BG/rc" > $BG/log 2>&1 < /dev/null &
    echo $! > $BG/pid
    echo "device_bg: started pid $(cat $BG/pid): $2"
    ;;
wait)
    limit=${2:-560}
    n=$(ls "${OUT:-/tmp}"/bg_*.tgz 2>/dev/null | wc -l)
    pack() {   # what the plan has so far, as $OUT/bg_<n>.tgz (whole: packed aside, then moved in)
        [ -n "${OUT:-}" ] || return 0
        rm -rf $BG/snap; mkdir -p $BG/snap
        snap=${SNAP:-/tmp/rw}
        [ -d "$snap" ] && (cd "$snap" && find . \( -name weights -o -name checkpoints -o -name trl_output \) -prune \
            -o -type f -size -20M -print | tar -cf - -T - 2>/dev/null | tar -C $BG/snap -xf -)
        tar czf $BG/pack.tgz -C $BG out log snap 2>/dev/null && mv -f $BG/pack.tgz "$OUT/bg_$n.tgz"
    }
    # Packed again every PACK_EVERY seconds while waiting: a call cut off (the session's device time
    # spent, the call's own limit) still returns what is under $OUT, so it returns the last pack.
    every=${PACK_EVERY:-60}
    t0=$(date +%s); last=$t0
    while [ ! -f $BG/rc ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
        sleep 5
        if [ $(( $(date +%s) - last )) -ge "$every" ]; then pack; last=$(date +%s); fi
    done
    pack
    if [ -f $BG/rc ]; then echo "device_bg: the plan ended, exit $(cat $BG/rc)"; else
        echo "device_bg: still running after ${limit} s of waiting"; fi
    tail -25 $BG/log
    ;;
*)
    echo "usage: device_bg.sh start 'COMMAND' | wait [SECONDS]" >&2; exit 2
    ;;
esac
