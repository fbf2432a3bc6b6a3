#!/usr/bin/env bash
# Drains a backlog (one INSERT … SELECT) of N no-op commands with R `icq work` replicas on a fresh
# PostgreSQL database and prints the rate, the poll index entries read
# (pg_stat_user_indexes.idx_tup_read), the CPU of every PostgreSQL process and of icq,
# and the HOT share of updates. Usage: drain-cpu.sh REPLICAS JOBS ICQ_BIN
set -euo pipefail
R=$1; N=$2; BIN=$3
DB=drain_$$
P="psql -h 127.0.0.1 -U postgres -qtA"
$P -d postgres -c "CREATE DATABASE $DB" >/dev/null
URL="postgres://postgres@127.0.0.1:5432/$DB"
D=$(mktemp -d)
( cd $D && $BIN migrate add --engine postgres >/dev/null && $BIN migrate run --database-url "$URL" >/dev/null )
$P -d $DB -c "INSERT INTO \"InternalCommands\" (\"Type\",\"Payload\") SELECT 'bench.noop','{}'::jsonb FROM generate_series(1,$N)" >/dev/null
$P -d $DB -c "VACUUM ANALYZE \"InternalCommands\"" >/dev/null
cat > $D/icq.yaml <<Y
sources:
  - name: main
    url: $URL
handlers:
  bench.noop:
    noop: true
Y
pgcpu() { local t=0; for p in $(pgrep -x postgres); do s=$(awk '{print $14+$15+$16+$17}' /proc/$p/stat 2>/dev/null || echo 0); t=$((t+s)); done; echo $t; }
read0=$($P -d $DB -c "select coalesce(sum(idx_tup_read),0) from pg_stat_user_indexes where indexrelname like '%oll%'")
c0=$(pgcpu)
start=$(date +%s.%N)
pids=()
for i in $(seq 1 $R); do /usr/bin/time -f "%U %S" -o $D/t$i $BIN work --until-idle --config $D/icq.yaml >/dev/null 2>$D/log$i & pids+=($!); done
for p in "${pids[@]}"; do wait $p; done
end=$(date +%s.%N)
c1=$(pgcpu)
sleep 0.5
read1=$($P -d $DB -c "select coalesce(sum(idx_tup_read),0) from pg_stat_user_indexes where indexrelname like '%oll%'")
left=$($P -d $DB -c "select count(*) from \"InternalCommands\" where \"ProcessedAt\" is null")
hot=$($P -d $DB -c "select n_tup_upd||'/'||n_tup_hot_upd from pg_stat_user_tables where relname='InternalCommands'")
icqcpu=$(cat $D/t* | grep -E '^[0-9.]+ [0-9.]+$' | awk '{s+=$1+$2} END {print s}')
secs=$(echo "$end - $start" | bc)
rate=$(echo "$N / $secs" | bc)
tck=$(getconf CLK_TCK)
echo "replicas=$R jobs=$N secs=$secs rate=$rate poll_idx_tup_read=$((read1-read0)) pg_cpu_s=$(echo "($c1-$c0)/$tck" | bc -l | cut -c1-5) icq_cpu_s=$icqcpu left=$left upd/hot=$hot"
$P -d postgres -c "DROP DATABASE $DB WITH (FORCE)" >/dev/null
rm -rf $D
