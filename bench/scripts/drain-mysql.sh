#!/usr/bin/env bash
set -euo pipefail
N=$1; BIN=$2
DB=drainm_$$_$RANDOM
mariadb -uroot -h127.0.0.1 -e "CREATE DATABASE $DB"
URL="mysql://root@127.0.0.1:3306/$DB"
D=$(mktemp -d)
( cd $D && $BIN migrate add --engine mysql >/dev/null && $BIN migrate run --database-url "$URL" >/dev/null )
mariadb -uroot -h127.0.0.1 $DB -e "INSERT INTO InternalCommands (Type, Payload) SELECT 'bench.noop', '{}' FROM seq_1_to_$N"
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
echo "mysql rate=$(echo "$N / ($end - $start)" | bc)"
mariadb -uroot -h127.0.0.1 -e "DROP DATABASE $DB"
rm -rf $D
