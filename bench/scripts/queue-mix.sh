#!/bin/bash
# Drain of N no-op commands: default queue (no `queues:`) vs a 4-queue mix (a worker
# listing q0..q3). Usage: queue-mix.sh ICQ_BINARY ENGINE(postgres|sqlite|mysql) N RUNS
set -e
ICQ=$1; ENGINE=$2; N=${3:-50000}; RUNS=${4:-3}
D=$(mktemp -d)
setup() { # $1 = queue expression
  if [ "$ENGINE" = postgres ]; then
    URL=postgres://postgres@127.0.0.1:5432/icq_v2p_bench
    psql -q -h 127.0.0.1 -U postgres -d test -c "DROP DATABASE IF EXISTS icq_v2p_bench" -c "CREATE DATABASE icq_v2p_bench" >/dev/null
    rm -rf $D/m; $ICQ migrate add --engine postgres --dir $D/m >/dev/null
    $ICQ migrate run --dir $D/m --database-url $URL >/dev/null
    psql -q -h 127.0.0.1 -U postgres -d icq_v2p_bench -c "INSERT INTO \"InternalCommands\" (\"Type\",\"Payload\",\"Queue\") SELECT 'noop', '{}', $1 FROM generate_series(1,$N) g;" -c "VACUUM ANALYZE \"InternalCommands\";" >/dev/null
  elif [ "$ENGINE" = mysql ]; then
    URL=mysql://root@127.0.0.1:3306/icq_v2m_bench
    mariadb -uroot -h127.0.0.1 -e "DROP DATABASE IF EXISTS icq_v2m_bench; CREATE DATABASE icq_v2m_bench"
    rm -rf $D/m; $ICQ migrate add --engine mysql --dir $D/m >/dev/null
    $ICQ migrate run --dir $D/m --database-url $URL >/dev/null
    mariadb -uroot -h127.0.0.1 icq_v2m_bench -e "INSERT INTO InternalCommands (Type, Payload, Queue) SELECT 'noop', '{}', $(echo "$1" | sed 's/||/,/; s/^/CONCAT(/; s/$/)/; s/(g % 4)/(seq % 4)/') FROM seq_1_to_$N; ANALYZE TABLE InternalCommands" >/dev/null
  else
    rm -f $D/b.db*; URL="sqlite://$D/b.db"
    rm -rf $D/m; $ICQ migrate add --engine sqlite --dir $D/m >/dev/null
    $ICQ migrate run --dir $D/m --database-url "$URL?mode=rwc" >/dev/null
    sqlite3 $D/b.db "WITH RECURSIVE g(g) AS (SELECT 1 UNION ALL SELECT g+1 FROM g WHERE g < $N) INSERT INTO InternalCommands (Type, Payload, Queue) SELECT 'noop', '{}', $1 FROM g;"
  fi
}
run() { # $1 = queues yaml ('' for none)
  printf "sources:\n  - name: b\n    url: \"%s\"\n%s\nhandlers:\n  noop: { noop: true }\n" "$URL" "$1" > $D/icq.yaml
  local s=$(date +%s.%N)
  RUST_LOG=warn $ICQ work --until-idle --config $D/icq.yaml >/dev/null 2>$D/err || { cat $D/err; exit 1; }
  local e=$(date +%s.%N)
  echo "$(echo "$e - $s" | bc)"
}
Q4="    queues: { q0: { concurrency: 2 }, q1: { concurrency: 2 }, q2: { concurrency: 2 }, q3: { concurrency: 2 } }\n"
Q4x8="    queues: { q0: { concurrency: 8 }, q1: { concurrency: 8 }, q2: { concurrency: 8 }, q3: { concurrency: 8 } }\n"
for r in $(seq $RUNS); do
  setup "'default'"; a=$(run "")
  setup "'q' || (g % 4)"; b=$(run "$(printf "$Q4")")
  setup "'q' || (g % 4)"; c=$(run "$(printf "$Q4x8")")
  echo "$ENGINE run $r: default queue ${a}s ($(echo "$N / $a" | bc)/s); 4 queues x2 ${b}s ($(echo "$N / $b" | bc)/s); 4 queues x8 ${c}s ($(echo "$N / $c" | bc)/s)"
done
rm -rf $D
