#!/bin/sh
# fs_bench.sh: cold sequential read throughput through `sluice mount` against
# the raw container, side by side, with the read limit of a blkio cgroup
# (the method of ../shared/tools/flashrun). Needs root.
#
#   fs_bench.sh [-b SLUICE] [-m MBPS] [-r RUNS] [-R READER] MODEL NAME=OPTS...
#
# NAME=OPTS is a mount configuration: OPTS is passed as `-o OPTS` ("-" for
# none). For every run, each configuration and the raw read take turns
# (interleaved): the page cache is dropped, the FUSE daemon is started inside
# the limited cgroup (it does the disk reads), and the slice files are read in
# container order by READER:
#   cat     dd bs=1M (buffered, through the kernel's FUSE readahead)
#   direct  dd bs=16M iflag=direct (FUSE direct I/O, requests of max_pages)
#   warm    like cat, but a second pass over a warm mount (page cache kept)
# raw reads the same slices straight from the container with dd bs=16M
# iflag=direct. Prints one line per run and a summary: min and median MB/s and
# the ratio of medians to raw.
set -eu
bin=sluice mbps=800 runs=3 reader=cat
while getopts b:m:r:R: opt; do
    case $opt in
    b) bin=$OPTARG ;;
    m) mbps=$OPTARG ;;
    r) runs=$OPTARG ;;
    R) reader=$OPTARG ;;
    *) echo "usage: fs_bench.sh [-b SLUICE] [-m MBPS] [-r RUNS] [-R cat|direct|warm] MODEL NAME=OPTS..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { echo "fs_bench.sh: need MODEL and at least one NAME=OPTS" >&2; exit 2; }
model=$(readlink -f "$1")
shift
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

now() { date +%s.%N; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
ingroup() { sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' ingroup "$group" "$@"; }

read_mount() { # $1 = mount point, $2 = dd flags
    while read -r off len path; do
        dd if="$1/$path" of=/dev/null $2 status=none
    done <"$work/slices"
}

one() { # $1 = name, $2 = opts; prints MB/s
    if [ "$1" = raw ]; then
        drop
        t0=$(now)
        model="$model" work="$work" ingroup sh -c '
            while read -r off len path; do
                dd if="$model" of=/dev/null bs=16M iflag=direct,skip_bytes,count_bytes skip="$off" count="$len" status=none
            done <"$work/slices"'
        t1=$(now)
    else
        mnt="$work/mnt.$1"
        mkdir -p "$mnt"
        o=""
        [ "$2" != "-" ] && o="-o $2"
        drop
        # shellcheck disable=SC2086
        ingroup "$bin" mount $o "$model" "$mnt"
        case $reader in
        cat) flags="bs=1M" ;;
        direct) flags="bs=16M iflag=direct" ;;
        warm) flags="bs=1M"; read_mount "$mnt" "$flags"; "$bin" umount "$mnt"; ingroup "$bin" mount $o "$model" "$mnt" ;;
        *) echo "fs_bench.sh: unknown reader $reader" >&2; exit 2 ;;
        esac
        t0=$(now)
        read_mount "$mnt" "$flags"
        t1=$(now)
        "$bin" umount "$mnt"
    fi
    awk -v b="$total" -v a="$t0" -v z="$t1" 'BEGIN {printf "%.1f\n", b / (z - a) / 1e6}'
}

echo "model $model: $(wc -l <"$work/slices") slices, $total bytes; limit $mbps MB/s; reader $reader; $runs runs"
: >"$work/results"
for r in $(seq 1 "$runs"); do
    for spec in raw=- "$@"; do
        n=${spec%%=*} o=${spec#*=}
        v=$(one "$n" "$o")
        echo "run $r $n $v MB/s"
        echo "$n $v" >>"$work/results"
    done
done
echo "summary (MB/s: min median; ratio of medians to raw)"
rawmed=$(awk '$1 == "raw" {print $2}' "$work/results" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
for spec in raw=- "$@"; do
    n=${spec%%=*}
    awk -v n="$n" '$1 == n {print $2}' "$work/results" | sort -n |
        awk -v n="$n" -v raw="$rawmed" -v o="${spec#*=}" '{a[NR] = $1} END {m = a[int((NR + 1) / 2)];
            printf "%-16s %8.1f %8.1f  %.3f  (-o %s)\n", n, a[1], m, m / raw, o}'
done
