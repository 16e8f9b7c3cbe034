#!/bin/sh
# plot-kl-bytes.sh DATA.tsv OUT.svg: KL divergence against file bytes, one
# line per series (docs/BENCHMARKS.md, issue 16). DATA: tab-separated rows
# "series<TAB>label<TAB>bytes<TAB>kl_mean" (a header line starting with '#'
# is skipped); the series are drawn in order of first appearance. Needs
# gnuplot (Debian: gnuplot-nox).
set -eu
[ $# -eq 2 ] || { echo "usage: plot-kl-bytes.sh DATA.tsv OUT.svg" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plot-kl-bytes: gnuplot missing (apt-get install gnuplot-nox)" >&2; exit 1; }
data=$1 out=$2
series=$(grep -v '^#' "$data" | cut -f1 | awk '!seen[$0]++')
plot=""
i=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
IFS='
'
for s in $series; do
  i=$((i + 1))
  awk -F'\t' -v s="$s" '$1 == s { print $3 / 1e6, $4, $2 }' "$data" > "$tmp/$i.dat"
  plot="$plot${plot:+, }'$tmp/$i.dat' using 1:2 with linespoints title '$s', '$tmp/$i.dat' using 1:2:3 with labels offset 0,1 font ',8' notitle"
done
gnuplot <<GP
set terminal svg size 800,500 font 'sans,11'
set output '$out'
set logscale y
set xlabel 'file size (MB; llama.cpp corrected for the FFN padding)'
set ylabel 'mean KL(P_float || P_quant) per token'
set grid
set key top right
plot $plot
GP
