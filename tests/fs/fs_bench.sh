#!/bin/sh
# fs_bench.sh: cold sequential read throughput through `sluice mount` against
# the raw container, side by side, with the read limit of a blkio cgroup
# (the method of ../shared/tools/flashrun). Needs root.
#
#   fs_bench.sh [-b SLUICE] [-x FS_READALL] [-m MBPS] [-r RUNS] [-R READER] [-s STREAMS]
#               MODEL NAME=OPTS...
#
# NAME=OPTS is a mount configuration: OPTS is passed as `-o OPTS` ("-" for
# none). For every run, each configuration and the raw read take turns
# (interleaved): the page cache is dropped, the FUSE daemon is started inside
# the limited cgroup (it does the disk reads), and one fs_readall process (built
# next to the tests: tests/fs/fs_readall) reads the slice files in container
# order, by READER:
#   cat      1 MiB reads (buffered, through the kernel's FUSE readahead)
#   direct   16 MiB O_DIRECT reads (FUSE direct I/O, requests of max_pages)
#   rewarm   cat after a first cat pass on the same mount (a reader restart)
#   rewarm_direct  direct after a first direct pass on the same mount
#   remount  cat after a first cat pass, an unmount and a new mount (a
#            daemon restart: what the page cache of the container keeps)
# -s STREAMS reads that many slices at once (parallel streams, each slice by
# one thread; raw too).
# raw reads the same bytes straight from the container, one fs_readall with
# 16 MiB O_DIRECT reads, inside the cgroup. Prints one line per run and a
# summary: min and median MB/s, the ratio of medians to raw, and the daemon's
# CPU time per pass.
set -eu
bin=sluice readall="" mbps=800 runs=3 reader=cat streams=1
while getopts b:x:m:r:R:s: opt; do
    case $opt in
    b) bin=$OPTARG ;;
    x) readall=$OPTARG ;;
    m) mbps=$OPTARG ;;
    r) runs=$OPTARG ;;
    R) reader=$OPTARG ;;
    s) streams=$OPTARG ;;
    *) echo "usage: fs_bench.sh [-b SLUICE] [-x FS_READALL] [-m MBPS] [-r RUNS] [-R cat|direct|rewarm|rewarm_direct|remount] [-s STREAMS] MODEL NAME=OPTS..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { echo "fs_bench.sh: need MODEL and at least one NAME=OPTS" >&2; exit 2; }
model=$(readlink -f "$1")
shift
[ -n "$readall" ] || readall=$(dirname "$(readlink -f "$(command -v "$bin")")")/../tests/fs/fs_readall
[ -x "$readall" ] || { echo "fs_bench.sh: no fs_readall at $readall (-x)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "fs_bench.sh: needs root (cgroups, drop_caches)" >&2; exit 77; }

dev=$(df --output=source "$model" | tail -n 1)
name=$(basename "$(readlink -f "$dev")")
[ -e "/sys/class/block/$name/partition" ] && name=$(basename "$(readlink -f "/sys/class/block/$name/..")")
majmin=$(cat "/sys/class/block/$name/dev")
work=$(mktemp -d /tmp/fs_bench.XXXXXX)
group=/sys/fs/cgroup/blkio/fs_bench.$$
mkdir -p "$group"
[ "$mbps" != 0 ] && echo "$majmin $((mbps * 1000000))" >"$group/blkio.throttle.read_bps_device"
cleanup() {
    for m in "$work"/mnt.*; do
        [ -d "$m" ] && { "$bin" umount "$m" 2>/dev/null || "$bin" umount --lazy "$m" 2>/dev/null || true; }
    done
    rmdir "$group" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# slice offsets, lengths and paths, in container order
"$bin" inspect "$model" >"$work/inspect" 2>/dev/null || true
mkdir -p "$work/probe"
"$bin" mount "$model" "$work/probe"
jq -r '.slices[] | "\(.offset) \(.length) \(.path)"' "$work/probe/manifest.json" >"$work/slices"
"$bin" umount "$work/probe"
total=$(awk '{s += $2} END {print s}' "$work/slices")

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
hz=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # the daemon's user + system ticks
ingroup() { sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' ingroup "$group" "$@"; }

read_mount() { # $1 = mount point, $2 = fs_readall flags; prints MB/s
    # shellcheck disable=SC2046
    "$readall" -t "$streams" $2 $(awk -v m="$1" '{print m "/" $3}' "$work/slices") | awk '{print $3}'
}

one() { # $1 = name, $2 = opts; prints MB/s
    if [ "$1" = raw ]; then
        drop
        c0=0 c1=0
        # shellcheck disable=SC2046
        v=$(ingroup "$readall" -t "$streams" -d -b 16777216 $(awk -v m="$model" '{print m "@" $1 "+" $2}' "$work/slices") |
            awk '{print $3}')
    else
        mnt="$work/mnt.$1"
        mkdir -p "$mnt"
        o=""
        [ "$2" != "-" ] && o="-o $2"
        drop
        # shellcheck disable=SC2086
        ingroup "$bin" mount $o "$model" "$mnt"
        case $reader in
        cat) flags="-b 1048576" ;;
        direct) flags="-d -b 16777216" ;;
        rewarm) flags="-b 1048576"; read_mount "$mnt" "$flags" >/dev/null ;;
        rewarm_direct) flags="-d -b 16777216"; read_mount "$mnt" "$flags" >/dev/null ;;
        remount) flags="-b 1048576"; read_mount "$mnt" "$flags" >/dev/null; "$bin" umount "$mnt"; ingroup "$bin" mount $o "$model" "$mnt" ;;
        *) echo "fs_bench.sh: unknown reader $reader" >&2; exit 2 ;;
        esac
        pid=$(jq .pid "$mnt/stats.json")
        c0=$(cpu "$pid")
        v=$(read_mount "$mnt" "$flags")
        c1=$(cpu "$pid")
        "$bin" umount "$mnt"
    fi
    echo "$v $(((c1 - c0) * 1000 / hz))"
}

echo "model $model: $(wc -l <"$work/slices") slices, $total bytes; limit $mbps MB/s; reader $reader; $streams streams; $runs runs"
: >"$work/results"
for r in $(seq 1 "$runs"); do
    for spec in raw=- "$@"; do
        n=${spec%%=*} o=${spec#*=}
        v=$(one "$n" "$o")
        echo "run $r $n ${v% *} MB/s, daemon cpu ${v#* } ms"
        echo "$n $v" >>"$work/results"
    done
done
echo "summary (MB/s: min median; ratio of medians to raw; daemon CPU ms per pass, median)"
rawmed=$(awk '$1 == "raw" {print $2}' "$work/results" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
for spec in raw=- "$@"; do
    n=${spec%%=*}
    cpumed=$(awk -v n="$n" '$1 == n {print $3}' "$work/results" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    awk -v n="$n" '$1 == n {print $2}' "$work/results" | sort -n |
        awk -v n="$n" -v raw="$rawmed" -v o="${spec#*=}" -v c="$cpumed" '{a[NR] = $1} END {m = a[int((NR + 1) / 2)];
            printf "%-16s %8.1f %8.1f  %.3f  %6d  (-o %s)\n", n, a[1], m, m / raw, c, o}'
done
