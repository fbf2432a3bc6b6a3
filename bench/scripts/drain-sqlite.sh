#!/usr/bin/env bash
# drain-sqlite.sh JOBS ICQ_BIN: drain N noop commands on a fresh SQLite file, print rate
set -euo pipefail
N=$1; BIN=$2
D=$(mktemp -d)
URL="sqlite://$D/q.db?mode=rwc"
( cd $D && $BIN migrate add --engine sqlite >/dev/null && $BIN migrate run --database-url "$URL" >/dev/null )
sqlite3 $D/q.db "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM s WHERE i < $N) INSERT INTO InternalCommands (Type, Payload) SELECT 'bench.noop', '{}' FROM s;"
cat > $D/icq.yaml <<Y
sources:
  - name: main
    url: "$URL"
handlers:
  bench.noop:
    noop: true
Y
start=$(date +%s.%N)
$BIN work --until-idle --config $D/icq.yaml >/dev/null 2>$D/log
end=$(date +%s.%N)
left=$(sqlite3 $D/q.db "select count(*) from InternalCommands where ProcessedAt is null")
echo "sqlite jobs=$N rate=$(echo "$N / ($end - $start)" | bc) left=$left"
rm -rf $D
