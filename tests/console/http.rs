//! The console over plain HTTP: figures equal the CLI's, lists filter and page, pages
//! escape, and every mutation needs actions allowed, the same origin and the token.

use std::process::Command;

use reqwest::StatusCode;

use crate::support::TestDb;
use crate::{
    BULK, BULK_QUEUE, Console, DEAD, DEAD_TRACE_PARENT, DEAD_UNIQUE_KEY, DUE_RECEIPTS,
    EMAILS_QUEUE, TOKEN, WEBHOOKS_QUEUE, XSS, pending_by_queue_json, pending_json, seeded,
    seeded_v1, state_of,
};

/// `GET path`: status and body.
async fn get(console: &Console, path: &str) -> (StatusCode, String) {
    let response = reqwest::get(console.url(path)).await.expect("GET");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

/// `POST path` with a form body and extra headers: status and body.
async fn post(
    console: &Console,
    path: &str,
    form: &[(&str, &str)],
    headers: &[(&str, String)],
) -> (StatusCode, String) {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut request = reqwest::Client::new()
        .post(console.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.expect("POST");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

/// The figure in the overview's cell for `source` and `state` (`data-source`,
/// `data-state` on the per-source table).
fn cell(page: &str, source: &str, state: &str) -> u64 {
    table_cell(
        page,
        "counts",
        &format!("data-source=\"{source}\" data-state=\"{state}\">"),
    )
}

/// The figure in the overview's per-queue table for `source`, `queue` and `state`.
fn queue_cell(page: &str, source: &str, queue: &str, state: &str) -> u64 {
    table_cell(
        page,
        "queue-counts",
        &format!("data-source=\"{source}\" data-state=\"{state}\" data-queue=\"{queue}\">"),
    )
}

/// How many rows the table `id` has (its `<tr>` in the body).
fn table_rows(page: &str, id: &str) -> usize {
    table(page, id)
        .split("<tbody>")
        .nth(1)
        .expect("a body")
        .matches("<tr>")
        .count()
}

fn table<'a>(page: &'a str, id: &str) -> &'a str {
    page.split(&format!("id=\"{id}\""))
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("no table {id} in {page}"))
}

fn table_cell(page: &str, id: &str, marker: &str) -> u64 {
    let rows = table(page, id);
    let after = rows
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no cell {marker} in {rows}"));
    let text = after.split("</a>").next().expect("a link");
    let number = text.rsplit('>').next().expect("a number");
    number.parse().expect("a count")
}

/// The queue column of a list or dead-letter page, in order.
fn listed_queues(page: &str) -> Vec<String> {
    page.split("<td class=\"queue\">")
        .skip(1)
        .map(|rest| rest.split("</td>").next().expect("a cell").to_owned())
        .collect()
}

/// `page` shows the error banner `needle` (escaped text).
fn has_banner(page: &str, needle: &str) -> bool {
    page.split("<div class=\"banner\" role=\"alert\">")
        .skip(1)
        .any(|rest| {
            rest.split("</div>")
                .next()
                .is_some_and(|b| b.contains(needle))
        })
}

/// Ids linked from a list page (`/command?source=…&id=ID`), in order.
fn listed_ids(page: &str) -> Vec<String> {
    page.split("<a class=\"id\" href=\"/command?")
        .skip(1)
        .map(|rest| {
            let href = rest.split('"').next().expect("an href");
            href.split("id=")
                .nth(1)
                .expect("an id parameter")
                .to_owned()
        })
        .collect()
}

fn next_page(page: &str) -> Option<String> {
    page.split("id=\"next-page\" href=\"").nth(1).map(|rest| {
        rest.split('"')
            .next()
            .expect("an href")
            .replace("&amp;", "&")
    })
}

async fn overview_counts_equal_pending_json(engine: &'static str) {
    let db = seeded(engine, "console_overview").await;
    let console = Console::start(&db.url, &[], None);
    let (status, page) = get(&console, "/").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let expected = pending_json(&db.url);
    let rows = expected.as_array().expect("an array");
    assert_eq!(rows.len(), 1);
    for row in rows {
        let source = row["source"].as_str().expect("a source");
        for state in ["due", "scheduled", "running", "dead", "completed"] {
            assert_eq!(
                Some(cell(&page, source, state)),
                row[state].as_u64(),
                "{state} in {source}"
            );
        }
    }
    assert_eq!(cell(&page, "default", "due"), DUE_RECEIPTS as u64);
    // Per source and queue: the figures of `icq pending --by-queue --format json`.
    let by_queue = pending_by_queue_json(&db.url);
    let by_queue = by_queue.as_array().expect("an array");
    assert_eq!(
        by_queue.len(),
        4,
        "default, bulk, emails, webhooks: {by_queue:?}"
    );
    assert_eq!(table_rows(&page, "queue-counts"), by_queue.len());
    for row in by_queue {
        let source = row["source"].as_str().expect("a source");
        let queue = row["queue"].as_str().expect("a queue");
        for state in ["due", "scheduled", "running", "dead", "completed"] {
            assert_eq!(
                Some(queue_cell(&page, source, queue, state)),
                row[state].as_u64(),
                "{state} in {source}/{queue}"
            );
        }
    }
    assert_eq!(queue_cell(&page, "default", BULK_QUEUE, "due"), BULK as u64);
    assert_eq!(queue_cell(&page, "default", EMAILS_QUEUE, "scheduled"), 2);
    assert_eq!(queue_cell(&page, "default", WEBHOOKS_QUEUE, "dead"), 2);
    // Each figure links to its list, filtered by the queue.
    assert!(
        page.contains("href=\"/list?source=default&amp;state=due&amp;queue=bulk\""),
        "{page}"
    );
    // The live fragment carries the same tables; the charts are inline SVG.
    let (_, live) = get(&console, "/live").await;
    assert_eq!(cell(&live, "default", "dead"), 2);
    assert_eq!(queue_cell(&live, "default", WEBHOOKS_QUEUE, "dead"), 2);
    assert!(live.contains("<svg"), "{live}");
}

async fn list_filters_by_type_and_pages(engine: &'static str) {
    let db = seeded(engine, "console_list").await;
    let console = Console::start(&db.url, &[], None);
    let mut path = "/list?state=due&type=orders.receipt&limit=7".to_string();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let (status, page) = get(&console, &path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(!page.contains("email.digest"), "filtered by type: {page}");
        let ids = listed_ids(&page);
        assert!(ids.len() <= 7);
        seen.extend(ids);
        pages += 1;
        match next_page(&page) {
            Some(next) => path = next,
            None => break,
        }
    }
    assert_eq!(pages, DUE_RECEIPTS.div_ceil(7));
    let mut distinct = seen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!((seen.len(), distinct.len()), (DUE_RECEIPTS, DUE_RECEIPTS));
    // Another type, another state.
    let (_, page) = get(&console, "/list?state=scheduled&type=email.digest").await;
    assert_eq!(listed_ids(&page).len(), 2, "{page}");
    let (_, page) = get(&console, "/list?state=dead").await;
    assert_eq!(listed_ids(&page), [DEAD, XSS], "newest first");
}

async fn list_filters_by_queue_and_pages(engine: &'static str) {
    let db = seeded(engine, "console_list_queue").await;
    let console = Console::start(&db.url, &[], None);
    // The queue filter is kept across keyset pages.
    let mut path = format!("/list?state=due&queue={BULK_QUEUE}&limit=2");
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let (status, page) = get(&console, &path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(
            page.contains("<input name=\"queue\" placeholder=\"any queue\" value=\"bulk\">"),
            "the form keeps the filter: {page}"
        );
        let queues = listed_queues(&page);
        assert!(queues.iter().all(|q| q == BULK_QUEUE), "{queues:?}");
        let ids = listed_ids(&page);
        assert_eq!(ids.len(), queues.len());
        seen.extend(ids);
        pages += 1;
        match next_page(&page) {
            Some(next) => {
                assert!(next.contains("queue=bulk"), "{next}");
                path = next;
            }
            None => break,
        }
    }
    assert_eq!(pages, BULK.div_ceil(2));
    let mut distinct = seen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!((seen.len(), distinct.len()), (BULK, BULK));
    // Type and queue together; another queue; a queue with nothing in it.
    let (_, page) = get(
        &console,
        "/list?state=due&type=orders.receipt&queue=default",
    )
    .await;
    assert_eq!(listed_ids(&page).len(), 25, "{page}");
    let (_, page) = get(
        &console,
        &format!("/list?state=scheduled&queue={EMAILS_QUEUE}"),
    )
    .await;
    assert_eq!(listed_queues(&page), [EMAILS_QUEUE, EMAILS_QUEUE], "{page}");
    let (status, page) = get(&console, "/list?state=due&queue=nowhere").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Nothing here."), "{page}");
    // A name that is not a queue name: the admin API's usage error, as a banner.
    let (status, page) = get(&console, "/list?state=due&queue=a%0Ab").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(has_banner(&page, "is not a queue name"), "{page}");
    // Dead letters: the Queue column and the filter.
    let (_, page) = get(&console, &format!("/dead-letters?queue={WEBHOOKS_QUEUE}")).await;
    assert_eq!(listed_ids(&page), [DEAD, XSS], "{page}");
    assert_eq!(listed_queues(&page), [WEBHOOKS_QUEUE, WEBHOOKS_QUEUE]);
    let (_, page) = get(&console, &format!("/dead-letters?queue={EMAILS_QUEUE}")).await;
    assert!(page.contains("No dead letters."), "{page}");
}

async fn show_page_and_escaping(engine: &'static str) {
    let db = seeded(engine, "console_show").await;
    let console = Console::start(&db.url, &[], None);
    let (status, page) = get(&console, &format!("/command?id={XSS}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("webhooks.deliver"));
    assert!(
        page.contains("&lt;script&gt;window.__xss = 1&lt;/script&gt;"),
        "payload escaped: {page}"
    );
    assert!(
        page.contains(
            "&lt;script&gt;window.__xss = 3&lt;/script&gt; failed &amp; &lt;b&gt;bold&lt;/b&gt;"
        ),
        "last error escaped: {page}"
    );
    assert!(!page.contains("<script>window"), "{page}");
    assert!(!page.contains("<img src=x"), "{page}");
    assert!(
        page.contains("{\n  &quot;html&quot;: "),
        "payload pretty-printed: {page}"
    );
    assert!(
        page.contains("<code id=\"command-queue\">webhooks</code>"),
        "{page}"
    );
    // Queue, priority, unique key, trace parent and snoozes of a version-2 row.
    let (_, shown) = get(&console, &format!("/command?id={DEAD}")).await;
    for needle in [
        "<dt>Queue</dt><dd><code id=\"command-queue\">webhooks</code></dd>".to_owned(),
        "<dt>Priority</dt><dd>-1</dd>".to_owned(),
        "<dt>Snoozes</dt><dd>3</dd>".to_owned(),
        format!("<code id=\"unique-key\">{DEAD_UNIQUE_KEY}</code>"),
        format!("<code id=\"trace-parent\">{DEAD_TRACE_PARENT}</code>"),
    ] {
        assert!(shown.contains(&needle), "{needle} in {shown}");
    }
    let (_, dead) = get(&console, "/dead-letters").await;
    assert!(dead.contains("&lt;script&gt;window.__xss = 3"), "{dead}");
    assert!(!dead.contains("<script>window"), "{dead}");
    // A missing id is a 404 page; a read-only console offers no actions.
    let (status, _) = get(&console, "/command?id=10000000-0000-4000-8000-00000000ffff").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!page.contains("/actions/"), "read-only: {page}");
}

async fn mutations_need_token_and_same_origin(engine: &'static str) {
    let db = seeded(engine, "console_actions").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let origin = format!("http://{}", console.host());
    let requeue = [("id", DEAD)];

    let (status, page) = get(&console, &format!("/actions/requeue?id={DEAD}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Requeue 1 command"), "{page}");

    // No token.
    let (status, page) = post(
        &console,
        "/actions/requeue",
        &requeue,
        &[("origin", origin.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert_eq!(state_of(&db.url, DEAD), "dead");
    // A wrong token.
    let wrong = [("id", DEAD), ("token", "nope")];
    let (status, _) = post(
        &console,
        "/actions/requeue",
        &wrong,
        &[("origin", origin.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The token, from another origin (and from nowhere).
    let with_token = [("id", DEAD), ("token", TOKEN)];
    let (status, _) = post(
        &console,
        "/actions/requeue",
        &with_token,
        &[("origin", "http://evil.example".into())],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post(
        &console,
        "/actions/requeue",
        &with_token,
        &[
            ("origin", origin.clone()),
            ("sec-fetch-site", "cross-site".into()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post(&console, "/actions/requeue", &with_token, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(state_of(&db.url, DEAD), "dead");

    // The token and the same origin: requeued.
    let (status, page) = post(
        &console,
        "/actions/requeue",
        &with_token,
        &[("origin", origin.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Requeued 1 command."), "{page}");
    assert_eq!(state_of(&db.url, DEAD), "due");

    // Purge shows its dry run first, then deletes (the token in a header this time).
    let (_, page) = get(&console, "/actions/purge?completed=1").await;
    assert!(page.contains("Delete 3 completed commands"), "{page}");
    assert_eq!(pending_json(&db.url)[0]["completed"], 3);
    let (status, page) = post(
        &console,
        "/actions/purge",
        &[("completed", "1")],
        &[("origin", origin.clone()), ("x-icq-token", TOKEN.into())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(pending_json(&db.url)[0]["completed"], 0);

    // Replay and cancel go through the same checks.
    let (status, page) = post(
        &console,
        "/actions/cancel",
        &[("id", crate::SCHEDULED), ("token", TOKEN)],
        &[("origin", origin.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(state_of(&db.url, crate::SCHEDULED), "dead");
    let (status, page) = post(
        &console,
        "/actions/replay",
        &[("id", XSS), ("token", TOKEN)],
        &[("origin", origin)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Replayed"), "{page}");
}

async fn bulk_actions_take_the_queue_filter(engine: &'static str) {
    let db = seeded(engine, "console_queue_actions").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let origin = vec![("origin", format!("http://{}", console.host()))];
    let queue_figure = |state: &str, queue: &str| {
        pending_by_queue_json(&db.url)
            .as_array()
            .expect("an array")
            .iter()
            .find(|row| row["queue"] == queue)
            .map_or(0, |row| row[state].as_u64().expect("a count"))
    };

    // The dead-letter page's bulk actions carry its queue filter.
    let (_, page) = get(&console, &format!("/dead-letters?queue={WEBHOOKS_QUEUE}")).await;
    assert!(
        page.contains("href=\"/actions/requeue?all_dead=1&amp;queue=webhooks\""),
        "{page}"
    );
    assert!(
        page.contains("href=\"/actions/purge?dead_letters=1&amp;queue=webhooks\""),
        "{page}"
    );

    // Cancel by queue: the confirmation says the queue, and keeps it in the form.
    let (status, page) = get(&console, &format!("/actions/cancel?queue={EMAILS_QUEUE}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(
            "Cancel 2 pending commands in queue emails in source default (--database-url)?"
        ),
        "{page}"
    );
    assert!(
        page.contains("<input type=\"hidden\" name=\"queue\" value=\"emails\">"),
        "{page}"
    );
    let (status, page) = post(
        &console,
        "/actions/cancel",
        &[("queue", EMAILS_QUEUE), ("token", TOKEN)],
        &origin,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Cancelled 2 commands."), "{page}");
    assert_eq!(queue_figure("dead", EMAILS_QUEUE), 2);
    assert_eq!(
        queue_figure("due", BULK_QUEUE),
        BULK as u64,
        "other queues untouched"
    );

    // Purge the dead letters of one queue: the dry run counts that queue only.
    let (_, page) = get(
        &console,
        &format!("/actions/purge?dead_letters=1&queue={EMAILS_QUEUE}"),
    )
    .await;
    assert!(
        page.contains(
            "Delete 2 dead letters in queue emails in source default (--database-url)? This cannot be undone."
        ),
        "{page}"
    );
    let (status, page) = post(
        &console,
        "/actions/purge",
        &[
            ("dead_letters", "1"),
            ("queue", EMAILS_QUEUE),
            ("token", TOKEN),
        ],
        &origin,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(queue_figure("dead", EMAILS_QUEUE), 0);
    assert_eq!(queue_figure("dead", WEBHOOKS_QUEUE), 2);

    // Requeue every dead letter of a type in a queue.
    let (_, page) = get(
        &console,
        &format!("/actions/requeue?all_dead=1&type=webhooks.deliver&queue={BULK_QUEUE}"),
    )
    .await;
    assert!(
        page.contains("id=\"nothing\""),
        "none of that type in bulk: {page}"
    );
    let (_, page) = get(
        &console,
        &format!("/actions/requeue?all_dead=1&type=webhooks.deliver&queue={WEBHOOKS_QUEUE}"),
    )
    .await;
    assert!(
        page.contains(
            "Requeue 2 dead letters of type webhooks.deliver in queue webhooks in source default (--database-url)?"
        ),
        "{page}"
    );
    let (status, page) = post(
        &console,
        "/actions/requeue",
        &[
            ("all_dead", "1"),
            ("type", "webhooks.deliver"),
            ("queue", WEBHOOKS_QUEUE),
            ("token", TOKEN),
        ],
        &origin,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Requeued 2 commands."), "{page}");
    assert_eq!(queue_figure("due", WEBHOOKS_QUEUE), 2);
    assert_eq!(state_of(&db.url, DEAD), "due");
}

/// A schema-version-1 table: the console shows its one queue, `default`, and a queue filter
/// is the admin API's usage error, shown as the page's banner, never a crash.
async fn a_version_1_table_refuses_the_queue_filter_with_a_banner(engine: &'static str) {
    let db = seeded_v1(engine, "console_v1").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let (status, page) = get(&console, "/").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(table_rows(&page, "queue-counts"), 1, "{page}");
    let expected = pending_by_queue_json(&db.url);
    assert_eq!(expected[0]["queue"], "default");
    assert_eq!(
        Some(queue_cell(&page, "default", "default", "due")),
        expected[0]["due"].as_u64()
    );
    let (status, page) = get(&console, "/list?state=due").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        listed_queues(&page).iter().all(|q| q == "default"),
        "{page}"
    );
    let (_, page) = get(&console, &format!("/command?id={DEAD}")).await;
    assert!(
        page.contains("<code id=\"command-queue\">default</code>"),
        "{page}"
    );
    for path in [
        "/list?state=due&queue=emails".to_owned(),
        "/dead-letters?queue=webhooks".to_owned(),
        "/actions/requeue?all_dead=1&queue=webhooks".to_owned(),
        "/actions/cancel?queue=emails".to_owned(),
        "/actions/purge?dead_letters=1&queue=webhooks".to_owned(),
    ] {
        let (status, page) = get(&console, &path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {page}");
        assert!(has_banner(&page, "schema version 1"), "{path}: {page}");
        assert!(has_banner(&page, "icq migrate add"), "{path}: {page}");
    }
    // The list keeps its form, so the filter can be cleared.
    let (_, page) = get(&console, "/list?state=due&queue=emails").await;
    assert!(page.contains("value=\"emails\""), "{page}");
    // A POST with a queue filter is refused the same way, and changes nothing.
    let (status, page) = post(
        &console,
        "/actions/requeue",
        &[("all_dead", "1"), ("queue", "webhooks"), ("token", TOKEN)],
        &[("origin", format!("http://{}", console.host()))],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(has_banner(&page, "schema version 1"), "{page}");
    assert_eq!(pending_json(&db.url)[0]["dead"], 2);
}

async fn read_only_console_refuses_every_mutation(engine: &'static str) {
    let db = seeded(engine, "console_read_only").await;
    // A token alone does not allow actions: --allow-actions does.
    let console = Console::start(&db.url, &[], Some(TOKEN));
    let origin = format!("http://{}", console.host());
    let (status, _) = get(&console, &format!("/actions/requeue?id={DEAD}")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for action in ["requeue", "replay", "cancel", "purge"] {
        let (status, page) = post(
            &console,
            &format!("/actions/{action}"),
            &[("id", DEAD), ("token", TOKEN), ("dead_letters", "1")],
            &[("origin", origin.clone())],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{action}: {page}");
        assert!(page.contains("read-only"), "{page}");
    }
    assert_eq!(pending_json(&db.url)[0]["dead"], 2);
}

/// The schedules page lists each configured schedule with the last occurrence the
/// database records and the next one, as `icq schedules --format json` does.
async fn schedules_page_lists_last_and_next(engine: &'static str) {
    let db = TestDb::with_table(engine, "console_schedules").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: \"{}\"\n    schedules:\n      \
             - {{ name: nightly-report, cron: \"0 3 * * *\", time_zone: Europe/Berlin, type: reports.nightly }}\n      \
             - {{ name: ten, every: 10m, type: health.ping, queue: pings }}\n\
             handlers:\n  reports.nightly: {{ noop: true }}\n  health.ping: {{ noop: true }}\n",
            db.url
        ),
    )
    .expect("write icq.yaml");
    let config = config.to_str().expect("a UTF-8 path");
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_icq"))
            .args(["--config", config])
            .args(args)
            .output()
            .expect("run icq");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    // A drain ticks the schedules once: each gets its last occurrence.
    cli(&["work", "--until-idle"]);
    let listed: serde_json::Value =
        serde_json::from_slice(&cli(&["schedules", "--format", "json"])).expect("JSON");
    let console = Console::start(&db.url, &["--config", config], None);
    let (status, page) = get(&console, "/schedules").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("aria-current=\"page\">Schedules</a>"),
        "{page}"
    );
    for needle in [
        "nightly-report",
        "0 3 * * *",
        "Europe/Berlin",
        "every 10m",
        "pings",
        "health.ping",
    ] {
        assert!(page.contains(needle), "{needle}: {page}");
    }
    for row in listed.as_array().expect("an array") {
        for field in ["last_occurrence", "next_occurrence"] {
            let at = chrono::DateTime::parse_from_rfc3339(row[field].as_str().expect("a time"))
                .expect("RFC 3339");
            let shown = at.format("%Y-%m-%d %H:%M:%S UTC").to_string();
            assert!(page.contains(&shown), "{field} {shown}: {page}");
        }
    }
}

/// Pausing a queue from the console: the overview offers it only with actions allowed,
/// the confirmation names the queue, the POST needs the token and the same origin, and the
/// overview then shows the queue paused and offers to resume it.
async fn pause_and_resume_a_queue_from_the_console(engine: &'static str) {
    let db = seeded(engine, "console_pause").await;
    let queue = icq::Queue::connect("default", &db.url, &Default::default(), &Default::default())
        .await
        .unwrap();
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let origin = format!("http://{}", console.host());
    let (status, page) = get(&console, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&format!("Pause {EMAILS_QUEUE}")), "{page}");

    let (status, page) = get(&console, &format!("/actions/pause?queue={EMAILS_QUEUE}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(&format!("Pause queue {EMAILS_QUEUE}")),
        "{page}"
    );
    let form = [("queue", EMAILS_QUEUE), ("token", TOKEN)];
    let (status, _) = post(
        &console,
        "/actions/pause",
        &form,
        &[("origin", "http://evil.example".into())],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        queue
            .queue_states()
            .await
            .unwrap()
            .iter()
            .all(|q| !q.paused),
        "{engine}"
    );

    let (status, page) = post(
        &console,
        "/actions/pause",
        &form,
        &[("origin", origin.clone())],
    )
    .await;
    assert!(
        status.is_success() || status.is_redirection(),
        "{status}: {page}"
    );
    let states = queue.queue_states().await.unwrap();
    assert!(
        states.iter().any(|q| q.queue == EMAILS_QUEUE && q.paused),
        "{engine}: {states:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, page) = get(&console, "/").await;
        if page.contains("id=\"paused-queues\"") && page.contains(&format!("Resume {EMAILS_QUEUE}"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{engine}: the overview shows the pause: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (status, _) = post(&console, "/actions/resume", &form, &[("origin", origin)]).await;
    assert!(status.is_success() || status.is_redirection());
    assert!(
        queue
            .queue_states()
            .await
            .unwrap()
            .iter()
            .all(|q| !q.paused),
        "{engine}"
    );
    queue.close().await;
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

on_engines!(
    overview_counts_equal_pending_json,
    list_filters_by_type_and_pages,
    list_filters_by_queue_and_pages,
    show_page_and_escaping,
    mutations_need_token_and_same_origin,
    bulk_actions_take_the_queue_filter,
    a_version_1_table_refuses_the_queue_filter_with_a_banner,
    read_only_console_refuses_every_mutation,
    schedules_page_lists_last_and_next,
    pause_and_resume_a_queue_from_the_console,
);

#[tokio::test]
async fn security_headers_and_loopback_host_only() {
    let db = TestDb::with_table("sqlite", "console_headers").await;
    let console = Console::start(&db.url, &[], None);
    let response = reqwest::get(console.url("/")).await.expect("GET");
    let headers = response.headers();
    let csp = headers["content-security-policy"].to_str().expect("ascii");
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let script = reqwest::get(console.url("/static/console.js"))
        .await
        .expect("GET");
    assert!(
        script.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/javascript")
    );
    // A DNS-rebinding page names the console by a host of its own: refused.
    let response = reqwest::Client::new()
        .get(console.url("/"))
        .header("host", "evil.example")
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
}

#[test]
fn exposing_the_console_or_actions_without_a_token_is_a_usage_error() {
    for (args, needle) in [
        (&["console", "--addr", "0.0.0.0:0"][..], "without a token"),
        (
            &["console", "--allow-actions"][..],
            "--allow-actions needs a token",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_icq"))
            .args(["--database-url", "sqlite::memory:"])
            .args(args)
            .env_remove("ICQ_CONSOLE_TOKEN")
            .output()
            .expect("run icq");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
}

#[tokio::test]
async fn a_non_loopback_console_asks_for_the_token_on_every_page() {
    let db = TestDb::with_table("sqlite", "console_signin").await;
    // 0.0.0.0 is not loopback; the test talks to it through 127.0.0.1.
    let console = Console::start(&db.url, &["--addr", "0.0.0.0:0"], Some(TOKEN));
    let port = console.base.rsplit(':').next().expect("a port").to_owned();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let response = client.get(format!("{base}/")).send().await.expect("GET");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/login");
    let response = client
        .get(format!("{base}/"))
        .header("x-icq-token", TOKEN)
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
    let response = client
        .post(format!("{base}/login"))
        .header("origin", &base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={TOKEN}"))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().expect("name=value");
    let response = client
        .get(format!("{base}/dead-letters"))
        .header("cookie", pair)
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_database_that_is_down_shows_a_banner_and_ctrl_c_stops_the_console() {
    // Nothing listens on port 1: every page shows the error, the server stays up.
    let mut console = Console::start("postgres://postgres:hunter2@127.0.0.1:1/test", &[], None);
    for path in [
        "/",
        "/list",
        "/dead-letters",
        &format!("/command?id={DEAD}"),
    ] {
        let (status, page) = get(&console, path).await;
        assert!(
            status.is_success() || status == StatusCode::SERVICE_UNAVAILABLE,
            "{path}: {status}"
        );
        assert!(page.contains("class=\"banner\""), "{path}: {page}");
        assert!(!page.contains("hunter2"), "no password on the page: {page}");
    }
    let status = console.interrupt().expect("the console stops on Ctrl-C");
    assert!(status.success(), "{status:?}");
}
