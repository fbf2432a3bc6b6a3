//! The console under a hostile browser, a careless address bar and a big table: filtered
//! actions act on their filter, other sites get a refusal and cost no query, the sampler
//! is idle while nobody watches, bad queries are pages that say what is wrong, short or
//! guessed tokens are refused, and connections, header time and page size are bounded.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::TestDb;
use crate::{Console, DEAD, SCHEDULED, TOKEN, WEBHOOKS_QUEUE, XSS, pending_json, seeded, state_of};

/// A completed `orders.receipt` command of the seed, made a `webhooks.deliver` one.
const COMPLETED_WEBHOOK: &str = "40000000-0000-4000-8000-000000000000";

async fn get(console: &Console, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let mut request = reqwest::Client::new().get(console.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("GET");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

async fn post(console: &Console, path: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let response = reqwest::Client::new()
        .post(console.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", format!("http://{}", console.host()))
        .body(body)
        .send()
        .await
        .expect("POST");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

/// A purge offered from a page filtered by type deletes that type only, dead letters and
/// completed commands alike, and its confirmation names the type, the queue, the source
/// and the count.
async fn an_action_from_a_filtered_page_acts_on_that_filter(engine: &'static str) {
    let db = seeded(engine, "console_filtered_purge").await;
    // One dead letter and two completed commands of another type than the filter's.
    let (table, ty, id) = (db.q("InternalCommands"), db.q("Type"), db.q("Id"));
    db.execute(&format!(
        "UPDATE {table} SET {ty} = 'orders.receipt' WHERE {id} = '{XSS}';
         UPDATE {table} SET {ty} = 'webhooks.deliver' WHERE {id} = '{COMPLETED_WEBHOOK}';"
    ))
    .await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let (status, page) = get(&console, "/dead-letters?type=webhooks.deliver", &[]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("href=\"/actions/requeue?all_dead=1&amp;type=webhooks.deliver\""),
        "requeue takes the type: {page}"
    );
    for kind in ["dead_letters", "completed"] {
        assert!(
            page.contains(&format!(
                "href=\"/actions/purge?{kind}=1&amp;type=webhooks.deliver\""
            )),
            "purge takes the type: {page}"
        );
    }
    let (status, page) = get(
        &console,
        &format!("/actions/purge?dead_letters=1&type=webhooks.deliver&queue={WEBHOOKS_QUEUE}"),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(
            "Delete 1 dead letter of type webhooks.deliver in queue webhooks in source default (--database-url)"
        ),
        "{page}"
    );
    let (status, page) = post(
        &console,
        "/actions/purge",
        &[
            ("dead_letters", "1"),
            ("type", "webhooks.deliver"),
            ("queue", WEBHOOKS_QUEUE),
            ("token", TOKEN),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("Deleted 1 dead letter of type webhooks.deliver in queue webhooks."),
        "{page}"
    );
    assert_eq!(
        state_of(&db.url, XSS),
        "dead",
        "another type's dead letter stays"
    );
    let (_, page) = get(
        &console,
        "/actions/purge?completed=1&type=webhooks.deliver",
        &[],
    )
    .await;
    assert!(
        page.contains(
            "Delete 1 completed command of type webhooks.deliver in source default (--database-url)"
        ),
        "{page}"
    );
    let (status, page) = post(
        &console,
        "/actions/purge",
        &[
            ("completed", "1"),
            ("type", "webhooks.deliver"),
            ("token", TOKEN),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let counts = pending_json(&db.url);
    assert_eq!(counts[0]["dead"], 1, "{counts}");
    assert_eq!(
        counts[0]["completed"], 2,
        "other types' completed stay: {counts}"
    );
    // Cancel from a list of due commands takes the scheduled ones of its filter too: the
    // button and the confirmation say so.
    let (_, page) = get(&console, "/list?state=due&type=email.digest", &[]).await;
    assert!(
        page.contains("Cancel every due and scheduled command of this type and queue"),
        "{page}"
    );
    let (_, page) = get(
        &console,
        "/actions/cancel?source=default&type=email.digest",
        &[],
    )
    .await;
    assert!(
        page.contains(
            "Cancel 2 pending commands of type email.digest in source default (--database-url)? They will not \
             run (they become dead letters). Due and scheduled ones alike"
        ),
        "{page}"
    );
    // Unfiltered by type, the confirmation names the queue, the sources and the count.
    let (_, page) = get(
        &console,
        &format!("/actions/purge?dead_letters=1&queue={WEBHOOKS_QUEUE}"),
        &[],
    )
    .await;
    assert!(
        page.contains("Delete 1 dead letter in queue webhooks in source default (--database-url)?"),
        "{page}"
    );
}

/// Replay applies to completed and dead commands only: the confirmation page of a
/// pending one refuses before any token is asked for.
async fn actions_are_offered_only_where_they_apply(engine: &'static str) {
    let db = seeded(engine, "console_replay_pending").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let (_, page) = get(&console, &format!("/command?id={SCHEDULED}"), &[]).await;
    assert!(!page.contains("/actions/replay"), "{page}");
    let (status, page) = get(&console, &format!("/actions/replay?id={SCHEDULED}"), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(
        !page.contains("name=\"token\""),
        "no form to confirm: {page}"
    );
    assert!(page.contains("only a completed or dead command"), "{page}");
    let (status, page) = get(&console, &format!("/actions/replay?id={DEAD}"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("name=\"token\""), "{page}");
}

/// Bad addresses are HTML pages that say what is wrong, with the status that fits.
async fn bad_queries_are_pages_that_say_what_is_wrong(engine: &'static str) {
    let db = seeded(engine, "console_bad_queries").await;
    let console = Console::start(&db.url, &[], None);
    for (path, status, needle) in [
        (
            "/list?before=yesterday",
            StatusCode::BAD_REQUEST,
            "unknown field `before`",
        ),
        ("/list?limit=0", StatusCode::BAD_REQUEST, "1 to 500"),
        ("/list?limit=501", StatusCode::BAD_REQUEST, "1 to 500"),
        ("/list?limit=lots", StatusCode::BAD_REQUEST, "limit"),
        ("/list?source=nosuch", StatusCode::NOT_FOUND, "`default`"),
        (
            "/dead-letters?sort=age",
            StatusCode::BAD_REQUEST,
            "unknown field `sort`",
        ),
        (
            &format!("/command?source=nosuch&id={DEAD}"),
            StatusCode::NOT_FOUND,
            "no source named `nosuch`",
        ),
    ] {
        let response = reqwest::get(console.url(path)).await.expect("GET");
        assert_eq!(response.status(), status, "{path}");
        let html = response.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/html");
        let page = response.text().await.expect("a body");
        assert!(html, "{path}: {page}");
        assert!(page.contains("class=\"banner\""), "{path}: {page}");
        assert!(page.contains(needle), "{path} says {needle}: {page}");
    }
}

/// A completed command keeps the error of an earlier attempt: the page says it is from
/// an earlier attempt and when the command completed.
async fn an_old_error_of_a_completed_command_is_labelled(engine: &'static str) {
    let db = seeded(engine, "console_old_error").await;
    let done = "40000000-0000-4000-8000-000000000000";
    db.execute(&format!(
        "UPDATE {} SET {} = 'timed out on attempt 1' WHERE {} = '{done}'",
        db.q("InternalCommands"),
        db.q("LastError"),
        db.q("Id")
    ))
    .await;
    let console = Console::start(&db.url, &[], None);
    let (status, page) = get(&console, &format!("/command?id={done}"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let note = page
        .split("id=\"last-error-note\">")
        .nth(1)
        .unwrap_or_else(|| panic!("a note on the old error: {page}"));
    assert!(
        note.starts_with("From an earlier attempt: the command completed at"),
        "{note}"
    );
    // A dead letter's error is its own: no note.
    let (_, page) = get(&console, &format!("/command?id={DEAD}"), &[]).await;
    assert!(!page.contains("last-error-note"), "{page}");
}

/// A large payload: the page shows its first part and links the whole as a JSON file.
async fn a_large_payload_is_cut_with_a_download_link(engine: &'static str) {
    let db = seeded(engine, "console_big_payload").await;
    let text = "\"".repeat(1 << 20);
    let payload = serde_json::json!({ "text": text });
    db.execute(&format!(
        "UPDATE {} SET {} = '{}' WHERE {} = '{DEAD}'",
        db.q("InternalCommands"),
        db.q("Payload"),
        payload.to_string().replace('\'', "''"),
        db.q("Id")
    ))
    .await;
    let console = Console::start(&db.url, &[], None);
    let (status, page) = get(&console, &format!("/command?id={DEAD}"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.len() < 600 * 1024, "a page of {} bytes", page.len());
    assert!(page.contains("id=\"payload-cut\""), "{}", &page[..2000]);
    let link = page
        .split("id=\"payload-download\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a download link")
        .replace("&amp;", "&");
    let response = reqwest::get(console.url(&link)).await.expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let disposition = response.headers()["content-disposition"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        disposition.starts_with("attachment;") && disposition.contains(DEAD),
        "{disposition}"
    );
    let body: serde_json::Value = response.json().await.expect("the payload as JSON");
    assert_eq!(body, payload);
}

macro_rules! on_engines {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name("sqlite").await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name("postgres").await;
                }
            )*
        }
    };
}

/// The source made from `--database-url` is named `default` (as in the CLI's JSON), which
/// is also the default queue's name: the console labels it with where it came from. A
/// source of that name read from a configuration file is shown as it is.
async fn the_source_from_a_url_is_labelled(engine: &'static str) {
    let db = seeded(engine, "console_url_label").await;
    let label = "default (--database-url)";
    let console = Console::start(&db.url, &[], None);
    let (status, page) = get(&console, "/list", &[]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(&format!(
            "<option value=\"default\" selected>{label}</option>"
        )),
        "{page}"
    );
    assert!(
        page.contains(&format!(" in <code>{label}</code>")),
        "{page}"
    );
    let (_, page) = get(&console, "/dead-letters", &[]).await;
    assert!(page.contains(&format!("<tr><td>{label}</td>")), "{page}");
    let (_, page) = get(&console, &format!("/command?id={DEAD}"), &[]).await;
    assert!(
        page.contains(&format!("in source <code>{label}</code>")),
        "{page}"
    );
    // The name itself is unchanged: in links, and in the CLI's JSON.
    assert!(page.contains("source=default&amp;id="), "{page}");
    assert_eq!(pending_json(&db.url)[0]["source"], "default");
    drop(console);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!("sources:\n  - name: default\n    url: \"{}\"\n", db.url),
    )
    .expect("write icq.yaml");
    let console = Console::start(
        &db.url,
        &["--config", config.to_str().expect("a UTF-8 path")],
        None,
    );
    let (status, page) = get(&console, "/list", &[]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("<option value=\"default\" selected>default</option>"),
        "{page}"
    );
    assert!(!page.contains("--database-url"), "{page}");
}

on_engines!(
    the_source_from_a_url_is_labelled,
    an_action_from_a_filtered_page_acts_on_that_filter,
    actions_are_offered_only_where_they_apply,
    bad_queries_are_pages_that_say_what_is_wrong,
    an_old_error_of_a_completed_command_is_labelled,
    a_large_payload_is_cut_with_a_download_link,
);

/// Transactions committed in the test's private database so far (PostgreSQL's own
/// statistics, read afresh from another database).
async fn commits(db: &TestDb) -> i64 {
    use sqlx::Connection as _;
    let admin = db
        .url
        .rsplit_once('/')
        .expect("a database in the URL")
        .0
        .to_owned()
        + "/test";
    let name = db
        .url
        .rsplit('/')
        .next()
        .expect("a database name")
        .to_owned();
    let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connect");
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut conn)
        .await
        .expect("fresh statistics");
    sqlx::query_scalar::<_, i64>(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
    )
    .bind(name)
    .fetch_one(&mut conn)
    .await
    .expect("the database's statistics")
}

/// Nobody watching: the console runs no query at all, and requests from other sites are
/// refused before anything is read (they do not count as watching). A page of its own
/// wakes the sampler.
#[tokio::test]
async fn no_query_while_nobody_watches_and_none_for_other_sites() {
    let db = seeded("postgres", "console_idle").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    // The seeding's own transactions reach the statistics when their connections flush
    // them, which a loaded machine can delay: count from once the figure holds still.
    let mut before = commits(&db).await;
    let settle = Instant::now() + Duration::from_secs(15);
    loop {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let now = commits(&db).await;
        if now == before || Instant::now() > settle {
            break;
        }
        before = now;
    }
    for path in [
        "/",
        "/live",
        "/list?state=completed",
        "/actions/purge?completed=1",
        "/static/console.js",
    ] {
        for headers in [
            &[("sec-fetch-site", "cross-site")][..],
            &[("sec-fetch-site", "same-site")][..],
            &[("origin", "http://evil.example")][..],
        ] {
            let (status, page) = get(&console, path, headers).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path} {headers:?}: {page}");
            assert!(page.starts_with("Refused"), "{page}");
        }
    }
    // Long enough for three samples, and for PostgreSQL to publish the statistics of
    // every transaction the console could have run (it flushes them within 10 s).
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert_eq!(
        commits(&db).await - before,
        0,
        "the console ran queries while nobody watched"
    );
    let (status, _) = get(&console, "/live", &[("sec-fetch-site", "same-origin")]).await;
    assert_eq!(status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(40);
    while commits(&db).await == before {
        assert!(Instant::now() < deadline, "a watched console counts");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn a_short_token_is_refused_saying_how_to_make_one() {
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["--database-url", "sqlite::memory:", "console"])
        .env("ICQ_CONSOLE_TOKEN", "a")
        .output()
        .expect("run icq");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at least 16"), "{stderr}");
    assert!(stderr.contains("openssl rand -hex 16"), "{stderr}");
}

/// After a few wrong tokens, tries are refused unchecked for a while, the right token
/// included: guessing is slowed to a few tries a minute.
#[tokio::test]
async fn repeated_wrong_tokens_are_slowed() {
    let db = seeded("sqlite", "console_guessing").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let mut throttled = false;
    for n in 0..6 {
        let guess = format!("guess-{n}");
        let (status, page) = post(
            &console,
            "/actions/requeue",
            &[("id", DEAD), ("token", &guess)],
        )
        .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            throttled = true;
            assert!(page.contains("too many wrong tokens"), "{page}");
            break;
        }
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    }
    assert!(throttled, "wrong tokens were never slowed");
    let (status, _) = post(
        &console,
        "/actions/requeue",
        &[("id", DEAD), ("token", TOKEN)],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "refused unchecked while it waits"
    );
    assert_eq!(state_of(&db.url, DEAD), "dead");
}

/// `VmRSS` of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// 5,000 half-sent requests and 12 slow readers of a 10 MB payload (its page and its
/// download) keep the console small; a half-sent request is closed after the header
/// time; the console answers again once they are gone.
#[tokio::test]
async fn half_open_connections_and_slow_readers_stay_bounded() {
    let db = seeded("postgres", "console_bounded").await;
    let text = "\"".repeat(10 << 20);
    db.execute(&format!(
        "UPDATE \"InternalCommands\" SET \"Payload\" = jsonb_build_object('text', '{text}'::text) WHERE \"Id\" = '{DEAD}'"
    ))
    .await;
    drop(text);
    let console = Console::start(&db.url, &[], None);
    let host = console.host().to_owned();
    let (status, _) = get(&console, "/", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let started = rss(console.pid());

    // Slow readers: the request is sent, the answer is not read.
    let mut readers = Vec::new();
    for n in 0..12 {
        let mut stream = TcpStream::connect(&host).expect("connect");
        let path = if n % 2 == 0 {
            format!("/command?id={DEAD}")
        } else {
            format!("/command/payload?id={DEAD}")
        };
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").expect("send");
        readers.push(stream);
    }
    // Half-sent requests: a request line and no end of headers, 5,000 tried at once.
    let attempts = (0..5000).map(|_| {
        let host = host.clone();
        async move {
            let connect = tokio::net::TcpStream::connect(host);
            let mut stream = tokio::time::timeout(Duration::from_secs(3), connect)
                .await
                .ok()?
                .ok()?;
            tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET / HTTP/1.1\r\nHost: ")
                .await
                .ok()?;
            Some(stream)
        }
    });
    let half_open: Vec<tokio::net::TcpStream> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(half_open.len() >= 256, "{} connections", half_open.len());
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        peak = peak.max(rss(console.pid()));
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "RSS: {} MB at rest, peak {} MB with {} half-open connections and 12 slow readers",
        started >> 20,
        peak >> 20,
        half_open.len()
    );
    assert!(peak < 150 << 20, "peak RSS {} MB", peak >> 20);

    drop(half_open);
    drop(readers);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answered = reqwest::Client::new()
            .get(console.url("/"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if answered.is_ok_and(|r| r.status() == StatusCode::OK) {
            break;
        }
        assert!(Instant::now() < deadline, "the console answers again");
    }
    // The header time: a half-sent request is closed by the console.
    let mut stream = tokio::net::TcpStream::connect(&host)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET / HTTP/1.1\r\nHost: ")
        .await
        .expect("send");
    let mut buffer = [0u8; 1024];
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut stream, &mut buffer),
    )
    .await;
    assert!(
        read.is_ok(),
        "the console kept a half-sent request open for 30 s"
    );
}
