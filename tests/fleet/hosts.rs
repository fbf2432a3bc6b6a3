//! libpq's query form of a host list (`?host=a,b&port=p1,p2`) on the shared server: a dead
//! port listed first is passed over by `icq migrate`, `icq work` and the operator
//! commands alike, and no secret of the URL reaches their output.

use std::process::{Command, Stdio};

use crate::failover::{free_port, icq_bin, icq_output};
use crate::support::TestDb;

/// `postgres://postgres@/DB?host=127.0.0.1,127.0.0.1&port=DEAD,5432`.
#[tokio::test]
async fn a_dead_port_listed_first_in_the_query_form_is_passed_over() {
    let db = TestDb::new("postgres", "query_hosts").await;
    let parsed = url::Url::parse(&db.url).expect("the test URL parses");
    let name = parsed.path().trim_start_matches('/');
    let port = parsed.port().unwrap_or(5432);
    let dead = free_port();
    // `PassWord` is a parameter sqlx would log with its value: dropped, never shown.
    let url = format!(
        "postgres://{}@/{name}?host=127.0.0.1,127.0.0.1&port={dead},{port}&PassWord=s3cret-marker",
        parsed.username()
    );
    let work = tempfile::tempdir().expect("temp dir");
    let dir = work.path().join("migrations");
    let dir_arg = dir.to_str().expect("a UTF-8 temp path");
    let (status, _, stderr) = icq_output(
        &["migrate", "add", "--engine", "postgres", "--dir", dir_arg],
        work.path(),
    );
    assert!(status.success(), "icq migrate add: {stderr}");
    let (status, stdout, stderr) = icq_output(
        &["migrate", "run", "--database-url", &url, "--dir", dir_arg],
        work.path(),
    );
    assert!(status.success(), "icq migrate run: {stdout}\n{stderr}");
    let mut all = stdout + &stderr;

    let (t, ty, payload) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {payload}) SELECT 'hosts.noop', '{{}}' FROM generate_series(1, 5)"
    ))
    .await;
    let config = work.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: {}\n    settings:\n      polling_interval_seconds: 0.2\n\
             handlers:\n  hosts.noop:\n    noop: true\n",
            serde_json::to_string(&url).unwrap()
        ),
    )
    .expect("write icq.yaml");
    let out = Command::new(icq_bin())
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env_remove("DATABASE_URL")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run icq work");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "icq work --until-idle: {stderr}");
    all.push_str(&stdout);
    all.push_str(&stderr);
    let done = format!(
        "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL",
        db.all_rows(),
        db.q("ProcessedAt")
    );
    assert_eq!(db.scalar_i64(&done).await, 5, "every command ran\n{stderr}");

    let (status, stdout, stderr) = icq_output(
        &["pending", "--format", "json", "--database-url", &url],
        work.path(),
    );
    assert!(status.success(), "icq pending: {stderr}");
    assert!(stdout.contains("\"completed\""), "{stdout}");
    all.push_str(&stdout);
    all.push_str(&stderr);
    assert!(!all.contains("s3cret-marker"), "a secret was shown:\n{all}");
    // The parameter sqlx would have logged is named, without its value.
    assert!(all.contains("PassWord"), "{all}");
}

/// A host list that breaks libpq's count rule is refused before connecting, by `icq config
/// check` and by a command given the URL, naming the rule and not the password.
#[test]
fn a_host_list_breaking_libpqs_count_rule_is_refused_naming_it() {
    let work = tempfile::tempdir().expect("temp dir");
    let url = "postgres://app:s3cret-marker@/orders?host=db1,db2&port=5432,5433,5434";
    let config = work.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: {}\nhandlers:\n  t:\n    noop: true\n",
            serde_json::to_string(url).unwrap()
        ),
    )
    .expect("write icq.yaml");
    let config = config.to_str().expect("a UTF-8 temp path");
    let rule = "3 port numbers for 2 hosts: libpq's rule is one port for every host, or a \
                single port for all of them";
    for args in [
        &["config", "check", "--config", config][..],
        &["pending", "--database-url", url],
    ] {
        let (status, stdout, stderr) = icq_output(args, work.path());
        assert_eq!(status.code(), Some(2), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(rule), "{args:?}: {stderr}");
        assert!(
            !(stdout + &stderr).contains("s3cret-marker"),
            "{args:?}: a secret was shown"
        );
    }
}
