//! `icq migrate add` / `icq migrate run`: sqlx-cli naming and versions, refusals, and
//! interplay with the real `sqlx` binary on every runtime engine.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use icq::ident::{Engine, TableName};
use icq::migrate::{self, AddOptions, MigrationKind, Versioning};
use predicates::prelude::*;

use crate::support::TestDb;

/// `icq` run inside `cwd`, with no ambient configuration or database URL.
pub(crate) fn icq(cwd: &Path) -> Command {
    let mut cmd = Command::cargo_bin("icq").unwrap();
    cmd.current_dir(cwd)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG");
    cmd
}

/// The real sqlx-cli: `$SQLX_BIN` when set, else sqlx-cli 0.9.0 built from
/// `tests/sqlx-cli/` (its own package and lock file) into `target/sqlx-cli/` on first use,
/// so `cargo test` needs no installed `sqlx`. The first build takes a few minutes; later
/// runs find it built.
pub(crate) fn sqlx_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(bin) = std::env::var_os("SQLX_BIN") {
        return bin.into();
    }
    BUILT.get_or_init(build_sqlx_cli).clone()
}

fn build_sqlx_cli() -> PathBuf {
    // target/<profile>/deps/cli-<hash> → target/
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary is in target/<profile>/deps");
    let target_dir = target.join("sqlx-cli");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sqlx-cli/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Its own target directory: no wait on the build lock `cargo test` may hold.
    let output = std::process::Command::new(cargo)
        .args(["build", "--quiet", "--locked", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo to build tests/sqlx-cli");
    assert!(
        output.status.success(),
        "building sqlx-cli from {} failed:\n{}",
        manifest.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    target_dir
        .join("debug")
        .join(format!("sqlx{}", std::env::consts::EXE_SUFFIX))
}

/// `sqlx migrate <args> --source dir --database-url url`, run inside `cwd`.
pub(crate) fn sqlx(cwd: &Path, args: &[&str], dir: &Path, url: &str) -> String {
    let output = std::process::Command::new(sqlx_bin())
        .current_dir(cwd)
        .env_remove("DATABASE_URL")
        .arg("migrate")
        .args(args)
        .arg("--source")
        .arg(dir)
        .args(["--database-url", url])
        .output()
        .expect("run sqlx");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "sqlx migrate {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// File names in `dir`, sorted.
pub(crate) fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub(crate) fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8(cmd.assert().success().get_output().stdout.clone()).unwrap()
}

fn is_timestamped(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .and_then(|rest| rest.strip_suffix("_add_internal_commands"))
        .is_some_and(|version| version.len() == 14 && version.bytes().all(|b| b.is_ascii_digit()))
}

#[test]
fn add_writes_a_timestamped_file_and_prints_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let out = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    let names = files(&tmp.path().join("migrations"));
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(is_timestamped(&names[0], ".sql"), "{names:?}");
    assert_eq!(out.trim(), format!("migrations/{}", names[0]));
    let sql = std::fs::read_to_string(tmp.path().join("migrations").join(&names[0])).unwrap();
    assert!(sql.starts_with("-- icq migration: engine=postgres table=InternalCommands\n"));
}

#[test]
fn add_continues_a_sequential_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("migrations");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("0001_users.sql"), "CREATE TABLE users (id INT);\n").unwrap();
    std::fs::write(dir.join("0002_posts.sql"), "CREATE TABLE posts (id INT);\n").unwrap();
    let out = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite"]));
    assert_eq!(out.trim(), "migrations/0003_add_internal_commands.sql");

    // A reversible sequential pair is still sequential (sqlx-cli 0.9 would fall back to a
    // timestamp here; icq compares versions, not files), and the kind follows it.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("0001_users.up.sql"),
        "CREATE TABLE users (id INT);\n",
    )
    .unwrap();
    std::fs::write(dir.join("0001_users.down.sql"), "DROP TABLE users;\n").unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite", "--dir", "db"]));
    assert_eq!(
        files(&dir),
        [
            "0001_users.down.sql",
            "0001_users.up.sql",
            "0002_add_internal_commands.down.sql",
            "0002_add_internal_commands.up.sql"
        ]
    );
}

#[test]
fn add_uses_timestamps_when_the_directory_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("migrations");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("20240101000000_users.sql"), "SELECT 1;\n").unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "mysql"]));
    let names = files(&dir);
    assert!(is_timestamped(&names[1], ".sql"), "{names:?}");
    assert!(names[1].as_str() > "20240101000000", "{names:?}");
}

#[test]
fn timestamp_and_sequential_flags_force_the_versioning() {
    let tmp = tempfile::tempdir().unwrap();
    let out =
        stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "mysql", "--sequential"]));
    assert_eq!(out.trim(), "migrations/0001_add_internal_commands.sql");
    let out = stdout_of(icq(tmp.path()).args([
        "migrate",
        "add",
        "--engine",
        "mysql",
        "--table",
        "Other",
        "--timestamp",
    ]));
    let name = Path::new(out.trim()).file_name().unwrap().to_str().unwrap();
    assert!(is_timestamped(name, ".sql"), "{out}");

    icq(tmp.path())
        .args(["migrate", "add", "--engine", "mysql", "-t", "-s"])
        .assert()
        .code(2);
}

#[test]
fn a_version_never_collides_nor_sorts_before_an_existing_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("migrations");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("99991231235959_from_the_future.sql"),
        "SELECT 1;\n",
    )
    .unwrap();
    let out = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite"]));
    assert_eq!(
        out.trim(),
        "migrations/99991231235960_add_internal_commands.sql"
    );

    // Twice within the same second: the second version is bumped, never reused.
    let tmp = tempfile::tempdir().unwrap();
    for table in ["First", "Second"] {
        stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite", "--table", table]));
    }
    let names = files(&tmp.path().join("migrations"));
    let versions: Vec<i64> = names
        .iter()
        .map(|n| n.split('_').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(versions.len(), 2);
    assert!(versions[0] < versions[1], "{names:?}");
}

#[test]
fn reversible_writes_an_up_down_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let out = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres", "-r"]));
    let names = files(&tmp.path().join("migrations"));
    assert!(is_timestamped(&names[0], ".down.sql") && is_timestamped(&names[1], ".up.sql"));
    assert_eq!(names[0].split('_').next(), names[1].split('_').next());
    let printed: Vec<&str> = out.lines().collect();
    assert_eq!(
        printed,
        [
            format!("migrations/{}", names[1]),
            format!("migrations/{}", names[0])
        ]
    );
    let down = std::fs::read_to_string(tmp.path().join("migrations").join(&names[0])).unwrap();
    assert!(
        down.contains(r#"DROP TABLE IF EXISTS "InternalCommands";"#),
        "{down}"
    );
}

#[test]
fn never_overwrites_and_leaves_nothing_half_written() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = AddOptions {
        engine: Engine::Postgres,
        table: TableName::default(),
        dir: tmp.path().to_path_buf(),
        kind: Some(MigrationKind::Reversible),
        versioning: Versioning::Sequential,
    };
    let plan = migrate::plan(&opts, chrono::Utc::now()).unwrap();
    // Someone else writes the down file between planning and writing.
    std::fs::write(&plan.files[1].path, "-- theirs\n").unwrap();
    let err = plan.write().unwrap_err();
    assert!(err.to_string().contains("never overwrites"), "{err}");
    assert_eq!(files(tmp.path()), ["0001_add_internal_commands.down.sql"]);
    assert_eq!(
        std::fs::read_to_string(&plan.files[1].path).unwrap(),
        "-- theirs\n"
    );
}

#[test]
fn refuses_to_mix_engines_in_one_directory() {
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    icq(tmp.path())
        .args(["migrate", "add", "--engine", "sqlite"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("already holds icq's postgres migration")
                .and(predicate::str::contains("--dir migrations/sqlite")),
        );
    icq(tmp.path())
        .args([
            "migrate",
            "add",
            "--engine",
            "sqlserver",
            "--dir",
            "migrations",
        ])
        .assert()
        .code(2);
    assert_eq!(files(&tmp.path().join("migrations")).len(), 1);

    // SQL Server goes to its own directory by default, which sqlx ignores.
    let out = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlserver"]));
    assert!(out.trim().starts_with("migrations/sqlserver/"), "{out}");
    let sqlserver = files(&tmp.path().join("migrations/sqlserver"));
    assert!(is_timestamped(&sqlserver[0], ".sql"), "{sqlserver:?}");
}

#[test]
fn stdout_prints_the_sql_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = stdout_of(icq(tmp.path()).args([
        "migrate", "add", "--engine", "mysql", "--table", "app.Jobs", "--stdout",
    ]));
    assert!(
        out.starts_with("-- icq migration: engine=mysql table=app.Jobs\n"),
        "{out}"
    );
    assert!(out.contains("CREATE TABLE `app`.`Jobs` ("), "{out}");
    assert!(out.contains("INDEX `IX_Jobs_Poll`"), "{out}");
    assert!(!tmp.path().join("migrations").exists());
}

#[test]
fn unknown_engine_exits_2_naming_the_choices() {
    let tmp = tempfile::tempdir().unwrap();
    icq(tmp.path())
        .args(["migrate", "add", "--engine", "oracle"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "postgres, sqlite, mysql, sqlserver",
        ));
    icq(tmp.path())
        .args(["migrate", "add", "--engine", "sqlite", "--table", "a;drop"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid table name"));
    assert!(!tmp.path().join("migrations").exists());
}

#[test]
fn engine_comes_from_the_database_url_when_not_given() {
    let tmp = tempfile::tempdir().unwrap();
    let out = stdout_of(icq(tmp.path()).args([
        "migrate",
        "add",
        "--database-url",
        "mariadb://app:s3cret@db/orders",
        "--stdout",
    ]));
    assert!(out.starts_with("-- icq migration: engine=mysql "), "{out}");
    let out = stdout_of(
        icq(tmp.path())
            .env("DATABASE_URL", "postgresql://db/orders")
            .args(["migrate", "add", "--stdout"]),
    );
    assert!(
        out.starts_with("-- icq migration: engine=postgres "),
        "{out}"
    );
    icq(tmp.path())
        .args(["migrate", "add"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--engine"));
}

#[test]
fn run_without_a_directory_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    icq(tmp.path())
        .args([
            "migrate",
            "run",
            "--database-url",
            "sqlite:x.db",
            "--dir",
            "nowhere",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("nowhere does not exist"));
    icq(tmp.path())
        .args(["migrate", "run"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--database-url"));
}

#[test]
fn run_refuses_sql_server_and_foreign_files() {
    let tmp = tempfile::tempdir().unwrap();
    icq(tmp.path())
        .args(["migrate", "run", "--database-url", "mssql://sa@db/app"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("sqlcmd"));
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    icq(tmp.path())
        .args(["migrate", "run", "--database-url", "sqlite:x.db?mode=rwc"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("was written for postgres"));
}

#[test]
fn run_never_prints_the_password() {
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    let assert = icq(tmp.path())
        .args([
            "migrate",
            "run",
            "--database-url",
            "postgres://app:s3cret@127.0.0.1:9/orders",
        ])
        .assert()
        .code(1);
    let output = assert.get_output();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!all.contains("s3cret"), "{all}");
    assert!(all.contains("app:***@127.0.0.1"), "{all}");
}

/// `icq migrate run` applies the generated file, sqlx-cli agrees it is installed, and a
/// second run has nothing to do.
async fn icq_run_then_sqlx_info(engine: &'static str) {
    let db = TestDb::new(engine, "icq_run").await;
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", engine]));
    let out = stdout_of(icq(tmp.path()).args(["migrate", "run", "--database-url", &db.url]));
    assert!(out.starts_with("Applied "), "{out}");
    assert!(out.contains("/migrate add internal commands ("), "{out}");

    let info = sqlx(tmp.path(), &["info"], Path::new("migrations"), &db.url);
    assert!(
        info.contains("installed") && info.contains("add internal commands"),
        "{info}"
    );
    assert!(
        !info.contains("pending") && !info.contains("different checksum"),
        "{info}"
    );

    let again = stdout_of(
        icq(tmp.path())
            .env("DATABASE_URL", &db.url)
            .args(["migrate", "run", "--format", "json"]),
    );
    let doc: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(doc["applied"], serde_json::json!([]));
    assert_eq!(doc["already_applied"], 1);

    let t = db.q("InternalCommands");
    db.execute(&format!(
        "INSERT INTO {t} ({}, {}) VALUES ('t', '{{}}')",
        db.q("Type"),
        db.q("Payload")
    ))
    .await;
    assert_eq!(db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await, 1);
}

#[tokio::test]
async fn icq_run_then_sqlx_info_shows_installed_postgres() {
    icq_run_then_sqlx_info("postgres").await;
}

#[tokio::test]
async fn icq_run_then_sqlx_info_shows_installed_sqlite() {
    icq_run_then_sqlx_info("sqlite").await;
}

#[tokio::test]
async fn icq_run_then_sqlx_info_shows_installed_mysql() {
    icq_run_then_sqlx_info("mysql").await;
}

#[tokio::test]
async fn icq_run_creates_a_missing_sqlite_database() {
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite"]));
    let out =
        stdout_of(icq(tmp.path()).args(["migrate", "run", "--database-url", "sqlite:fresh.db"]));
    assert!(out.starts_with("Applied "), "{out}");
    assert!(tmp.path().join("fresh.db").is_file());
}

/// sqlx-cli applies the generated file, reverts a reversible pair completely, and icq's
/// migrator agrees with its bookkeeping afterwards.
async fn sqlx_run_and_revert(engine: &'static str) {
    let db = TestDb::new(engine, "sqlx_run").await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = Path::new("migrations");
    std::fs::create_dir(tmp.path().join(dir)).unwrap();
    std::fs::write(
        tmp.path().join("migrations/0001_before.up.sql"),
        "CREATE TABLE before_icq (id INT);\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("migrations/0001_before.down.sql"),
        "DROP TABLE before_icq;\n",
    )
    .unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", engine, "-r"]));
    assert!(
        tmp.path()
            .join("migrations/0002_add_internal_commands.up.sql")
            .is_file()
    );

    let out = sqlx(tmp.path(), &["run"], dir, &db.url);
    assert!(
        out.contains("Applied 2/migrate add internal commands"),
        "{out}"
    );
    let out = stdout_of(icq(tmp.path()).args(["migrate", "run", "--database-url", &db.url]));
    assert!(
        out.contains("up to date (2 migrations already applied)"),
        "{out}"
    );

    let t = db.q("InternalCommands");
    db.execute(&format!(
        "INSERT INTO {t} ({}, {}) VALUES ('t', '{{}}')",
        db.q("Type"),
        db.q("Payload")
    ))
    .await;

    let out = sqlx(tmp.path(), &["revert"], dir, &db.url);
    assert!(
        out.contains("Applied 2/revert add internal commands"),
        "{out}"
    );
    let leftovers = match engine {
        "postgres" => {
            "SELECT (SELECT COUNT(*) FROM pg_class WHERE relname LIKE '%InternalCommands%')
                  + (SELECT COUNT(*) FROM pg_trigger WHERE tgname LIKE 'icq_%')
                  + (SELECT COUNT(*) FROM pg_proc WHERE proname LIKE 'icq_%')"
        }
        "sqlite" => "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '%InternalCommands%'",
        _ => {
            "SELECT COUNT(*) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'InternalCommands'"
        }
    };
    assert_eq!(
        db.scalar_i64(leftovers).await,
        0,
        "{engine}: revert left something"
    );
    assert_eq!(db.scalar_i64("SELECT COUNT(*) FROM before_icq").await, 0);

    // And icq puts it back, as sqlx-cli would.
    let out = stdout_of(icq(tmp.path()).args(["migrate", "run", "--database-url", &db.url]));
    assert!(
        out.starts_with("Applied 2/migrate add internal commands (") && out.lines().count() == 1,
        "{out}"
    );
}

#[tokio::test]
async fn sqlx_cli_runs_and_reverts_the_generated_files_postgres() {
    sqlx_run_and_revert("postgres").await;
}

#[tokio::test]
async fn sqlx_cli_runs_and_reverts_the_generated_files_sqlite() {
    sqlx_run_and_revert("sqlite").await;
}

#[tokio::test]
async fn sqlx_cli_runs_and_reverts_the_generated_files_mysql() {
    sqlx_run_and_revert("mysql").await;
}

#[test]
fn sqlx_migrate_add_continues_after_icq() {
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite", "--sequential"]));
    let status = std::process::Command::new(sqlx_bin())
        .current_dir(tmp.path())
        .args(["migrate", "add", "users"])
        .output()
        .unwrap();
    assert!(status.status.success());
    assert_eq!(
        files(&tmp.path().join("migrations")),
        ["0001_add_internal_commands.sql", "0002_users.sql"]
    );
}

/// An older icq's simple version-1 migration for `engine` in `dir`, as `<version>_add_internal_commands.sql`.
fn write_v1(dir: &Path, version: &str, engine: Engine) {
    let table = TableName::default();
    let header = format!("{} engine={engine} table={table}\n", migrate::HEADER_PREFIX);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(format!("{version}_add_internal_commands.sql")),
        format!("{header}{}", icq::schema::render_v1(engine, &table).up),
    )
    .unwrap();
}

#[test]
fn add_next_to_a_version_1_migration_writes_the_upgrade_on_every_engine() {
    for engine in Engine::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(migrate::default_dir(engine));
        write_v1(&dir, "0001", engine);
        let out = icq(tmp.path())
            .args(["migrate", "add", "--engine", engine.name()])
            .assert()
            .success()
            .get_output()
            .clone();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let expected = migrate::default_dir(engine).join("0002_icq_schema_v4.sql");
        assert_eq!(stdout, format!("{}\n", expected.display()), "{engine}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains("at schema version 1; the new migration upgrades it to version 4")
                && stderr.contains("restart the workers"),
            "{engine}: {stderr}"
        );
        let sql = std::fs::read_to_string(tmp.path().join(&expected)).unwrap();
        let upgrade = icq::schema::render_upgrade_from(engine, &TableName::default(), 1).up;
        assert_eq!(
            sql,
            format!(
                "{} engine={engine} table=InternalCommands\n{upgrade}",
                migrate::HEADER_PREFIX
            )
        );

        // Then it is up to date: exit 0, nothing written, in JSON too.
        let doc: serde_json::Value = serde_json::from_str(&stdout_of(icq(tmp.path()).args([
            "migrate",
            "add",
            "--engine",
            engine.name(),
            "--format",
            "json",
        ])))
        .unwrap();
        assert_eq!(doc["action"], "up_to_date", "{doc}");
        assert_eq!(doc["schema_version"], icq::schema::SCHEMA_VERSION);
        assert_eq!(doc["files"], serde_json::json!([]));
        assert_eq!(
            doc["existing"],
            expected.display().to_string(),
            "the upgrade is what makes it up to date"
        );
        assert_eq!(files(&dir).len(), 2, "{engine}: {:?}", files(&dir));
    }
}

#[test]
fn add_json_says_create_or_upgrade() {
    let tmp = tempfile::tempdir().unwrap();
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(
        icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite", "--format", "json"]),
    ))
    .unwrap();
    assert_eq!(doc["action"], "create");
    assert_eq!(doc["existing"], serde_json::Value::Null);

    let tmp = tempfile::tempdir().unwrap();
    write_v1(&tmp.path().join("migrations"), "0001", Engine::Sqlite);
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(icq(tmp.path()).args([
        "migrate", "add", "--engine", "sqlite", "-r", "--format", "json",
    ])))
    .unwrap();
    assert_eq!(doc["action"], "upgrade");
    assert_eq!(doc["version"], "0002");
    assert_eq!(doc["kind"], "reversible");
    assert_eq!(doc["existing"], "migrations/0001_add_internal_commands.sql");
    let names = files(&tmp.path().join("migrations"));
    assert_eq!(
        names,
        [
            "0001_add_internal_commands.sql",
            "0002_icq_schema_v4.down.sql",
            "0002_icq_schema_v4.up.sql"
        ]
    );
    let down =
        std::fs::read_to_string(tmp.path().join("migrations/0002_icq_schema_v4.down.sql")).unwrap();
    assert!(down.contains("DROP COLUMN \"Queue\""), "{down}");
    assert!(down.contains("Every row survives"), "{down}");
    assert!(
        down.find("DROP TABLE \"InternalCommandsHistory\"") < down.find("DROP COLUMN \"Queue\""),
        "history goes back first: {down}"
    );
}

#[test]
fn add_stdout_prints_the_upgrade_and_nothing_when_up_to_date() {
    let tmp = tempfile::tempdir().unwrap();
    write_v1(&tmp.path().join("migrations"), "0001", Engine::Postgres);
    let out =
        stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres", "--stdout"]));
    assert!(out.contains(r#"ADD COLUMN "Queue""#), "{out}");
    assert!(
        !out.contains(r#"CREATE TABLE "InternalCommands" "#),
        "{out}"
    );
    assert!(
        out.contains(r#"CREATE TABLE "InternalCommandsHistory" "#),
        "{out}"
    );
    assert_eq!(
        files(&tmp.path().join("migrations")).len(),
        1,
        "nothing written"
    );

    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    icq(tmp.path())
        .args(["migrate", "add", "--engine", "postgres", "--stdout"])
        .assert()
        .success()
        .stdout("")
        .stderr(predicate::str::contains("is up to date"));
}

/// A file's version is told by its SQL, not its comments: a v1 file stripped of comments
/// stays version 1, a v2 upgrade stripped of comments stays version 2, a v3 one version 3,
/// and a v1 file for a table named `Queue` is still version 1.
#[test]
fn the_version_of_an_existing_migration_survives_edits() {
    let strip = |sql: &str| -> String {
        sql.lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    for (table, engine) in [
        ("InternalCommands", Engine::Mysql),
        ("Queue", Engine::Postgres),
    ] {
        let table = TableName::parse(table).unwrap();
        let header = format!("{} engine={engine} table={table}\n", migrate::HEADER_PREFIX);
        let v1 = strip(&icq::schema::render_v1(engine, &table).up);
        let v2 = strip(&icq::schema::render_upgrade(engine, &table).up);
        let v3 = strip(&icq::schema::render(engine, &table).up);
        let opts = |dir: &Path| AddOptions {
            engine,
            table: table.clone(),
            dir: dir.to_owned(),
            kind: None,
            versioning: Versioning::Inferred,
        };
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("0001_add_internal_commands.sql"),
            format!("{header}{v1}"),
        )
        .unwrap();
        let plan = migrate::plan(&opts(tmp.path()), chrono::Utc::now()).unwrap();
        assert!(
            matches!(plan.action, migrate::PlanAction::Upgrade { .. }),
            "{engine} {table}: {:?}",
            plan.action
        );
        std::fs::write(
            tmp.path().join("0002_icq_schema_v2.sql"),
            format!("{header}{v2}"),
        )
        .unwrap();
        let plan = migrate::plan(&opts(tmp.path()), chrono::Utc::now()).unwrap();
        assert!(
            matches!(plan.action, migrate::PlanAction::Upgrade { version: 2, .. }),
            "{engine} {table}: {:?}",
            plan.action
        );
        std::fs::remove_file(tmp.path().join("0002_icq_schema_v2.sql")).unwrap();
        std::fs::write(
            tmp.path().join("0001_add_internal_commands.sql"),
            format!("{header}{v3}"),
        )
        .unwrap();
        let plan = migrate::plan(&opts(tmp.path()), chrono::Utc::now()).unwrap();
        assert!(
            matches!(plan.action, migrate::PlanAction::UpToDate { .. }),
            "{engine} {table}: {:?}",
            plan.action
        );
    }
}
