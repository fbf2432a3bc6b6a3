//! Reaching the server before the pool gives up: a connection that takes longer than
//! [`PROBE_AFTER`] is checked with a plain TCP connect, so a refused port or an
//! unresolvable host fails at once with its cause, and a mistyped URL (an unescaped `@`
//! in the password) gets a hint. A server that answers but refuses the login with an error
//! the pool would retry until its timeout (PostgreSQL's `too many connections`) is logged
//! in to once more on the side, so its own message is reported at once instead of `pool
//! timed out`; a MySQL/MariaDB URL whose port answers as PostgreSQL is named as such, and
//! a PostgreSQL URL whose port answers as MySQL/MariaDB.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::ident::Engine;

/// How long [`probe`] waits for the server's host to resolve and its port to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the pool may take to connect before [`probe`] is asked why (a local server
/// answers in a few milliseconds; a pool facing a refused port retries until its acquire
/// timeout).
pub const PROBE_AFTER: Duration = Duration::from_millis(250);

/// Awaits `connecting` (a driver connecting to `url`); when that takes longer than
/// [`PROBE_AFTER`], probes the server meanwhile and fails at once with the probe's reason
/// if it is unreachable. [`super::connect`] runs every connection through this, so
/// the CLI, `Queue::connect` and `icq bench` all fail fast on a refused port.
pub(crate) async fn watch_connect<T>(
    url: &str,
    connecting: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    // A setting the driver would refuse is named before anything connects.
    super::url::check_parameters(url)?;
    tokio::pin!(connecting);
    let explain = |err| with_password_hint(url, err);
    tokio::select! {
        result = &mut connecting => return match result {
            Err(err) => Err(explain(mysql_on_postgres_url(url, err).await)),
            ok => ok,
        },
        () = tokio::time::sleep(PROBE_AFTER) => {}
    }
    tokio::select! {
        result = &mut connecting => return result.map_err(explain),
        probed = probe(url) => {
            if let Err(reason) = probed {
                return Err(connect_error(url, reason));
            }
        }
    }
    tokio::select! {
        result = &mut connecting => return result.map_err(explain),
        refused = handshake(url) => {
            if let Some(err) = refused {
                return Err(explain(err));
            }
        }
    }
    connecting.await.map_err(explain)
}

/// Logs in to a PostgreSQL server once, on a connection of its own, and returns the
/// server's refusal, if it refuses for a reason that will not pass while the pool waits:
/// the pool retries `too many connections` (SQLSTATE 53300, also a role's or database's
/// `CONNECTION LIMIT`) until its acquire timeout and then reports only `pool timed out`,
/// hiding the server's message. A server that is starting up (57P03) is waited for;
/// nothing is returned for other engines (their pools report the server's error at once),
/// for a URL the probe does not apply to, or when the login works (the pool is slow for
/// another reason and is awaited).
async fn handshake(url: &str) -> Option<Error> {
    let (host, port) = probe_target(url)?;
    let engine = Engine::from_url(url).ok()?;
    if engine == Engine::Mysql {
        // A MySQL client waits for the server's greeting, and a PostgreSQL server for the
        // client's first message: neither says anything until the pool gives up.
        return speaks_postgres(&host, port).await.then(|| Error::Connect {
            context: format!("cannot connect to {}", crate::redact::redact_url(url)),
            reason: format!(
                "the server at {} answers as PostgreSQL, not MySQL/MariaDB",
                shown_address(&host, port)
            ),
            hint: "; hint: use a postgres:// URL for a PostgreSQL server, or the port of \
                   the MySQL/MariaDB server (3306 by default)"
                .to_owned(),
        });
    }
    if engine != Engine::Postgres {
        return None;
    }
    // Without the `postgres` feature the URL was refused before anything connected.
    #[cfg(feature = "postgres")]
    return super::postgres::login_refusal(url).await;
    #[cfg(not(feature = "postgres"))]
    None
}

/// PostgreSQL's `SSLRequest`: a length of 8 and the code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Whether the server at `host:port` answers an `SSLRequest` as PostgreSQL does: with the
/// one byte `S` or `N`, then silence while it waits for the next message. A MySQL or
/// MariaDB server greets every connection with a packet of tens of bytes instead, so a
/// slow MySQL server is never mistaken for PostgreSQL (it is just not identified).
async fn speaks_postgres(host: &str, port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let ask = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(&SSL_REQUEST).await.ok()?;
        let mut answer = [0u8; 64];
        let read = stream.read(&mut answer).await.ok()?;
        if read != 1 || !matches!(answer[0], b'S' | b'N') {
            return Some(false);
        }
        let more = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut answer)).await;
        Some(!matches!(more, Ok(Ok(n)) if n > 0))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, ask).await,
        Ok(Some(true))
    )
}

/// `err` of a PostgreSQL URL whose port answers as MySQL/MariaDB, named as such: the
/// driver reads the server's greeting as a reply to its first message and reports only
/// "unexpected response from SSLRequest". Any other error is returned as it is.
async fn mysql_on_postgres_url(url: &str, err: Error) -> Error {
    let protocol = matches!(
        &err,
        Error::Database {
            cause: sqlx::Error::Protocol(_),
            ..
        }
    );
    if !protocol || Engine::from_url(url).ok() != Some(Engine::Postgres) {
        return err;
    }
    let Some((host, port)) = probe_target(url) else {
        return err;
    };
    if !greets_as_mysql(&host, port).await {
        return err;
    }
    Error::Connect {
        context: format!("cannot connect to {}", crate::redact::redact_url(url)),
        reason: format!(
            "the server at {} answers as MySQL/MariaDB, not PostgreSQL",
            shown_address(&host, port)
        ),
        hint: "; hint: use a mysql:// URL for a MySQL/MariaDB server, or the port of the \
               PostgreSQL server (5432 by default)"
            .to_owned(),
    }
}

/// Whether the server at `host:port` speaks first with a MySQL/MariaDB packet: a 3-byte
/// length, sequence number 0, then protocol version 10 (a greeting) or 0xff (an error,
/// e.g. too many connections). A PostgreSQL server says nothing until the client does.
async fn greets_as_mysql(host: &str, port: u16) -> bool {
    use tokio::io::AsyncReadExt;

    let listen = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let mut packet = [0u8; 5];
        stream.read_exact(&mut packet).await.ok()?;
        Some(packet[3] == 0 && matches!(packet[4], 10 | 0xff))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, listen).await,
        Ok(Some(true))
    )
}

/// `host:port`, with an IPv6 address in brackets.
fn shown_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Checks that the server a database URL names accepts TCP connections, within
/// [`PROBE_TIMEOUT`]; the error is the reason, e.g. `connection refused (127.0.0.1:1)`.
///
/// Nothing is checked for SQLite (a file), for a URL that does not parse or has no host
/// (the driver reports those), or when the URL's query picks the host, port or a Unix
/// socket itself (`?host=/run/postgresql`, `?socket=...`).
pub async fn probe(url: &str) -> std::result::Result<(), String> {
    let Some((host, port)) = probe_target(url) else {
        return Ok(());
    };
    reach(&host, port).await
}

/// The host and port [`probe`] connects to, when it applies to `url`.
fn probe_target(url: &str) -> Option<(String, u16)> {
    let default_port = match Engine::from_url(url).ok()? {
        Engine::Postgres => 5432,
        Engine::Mysql => 3306,
        Engine::Sqlite | Engine::SqlServer => return None,
    };
    let parsed = url::Url::parse(url).ok()?;
    let chooses_its_own = parsed
        .query_pairs()
        .any(|(key, _)| matches!(key.as_ref(), "host" | "hostaddr" | "port" | "socket"));
    if chooses_its_own {
        return None;
    }
    let host = match parsed.host()? {
        url::Host::Domain(name) => name.to_owned(),
        url::Host::Ipv4(ip) => ip.to_string(),
        url::Host::Ipv6(ip) => ip.to_string(),
    };
    Some((host, parsed.port().unwrap_or(default_port)))
}

/// Resolves `host` and tries each of its addresses until one accepts a TCP connection.
async fn reach(host: &str, port: u16) -> std::result::Result<(), String> {
    let shown = shown_address(host, port);
    let seconds = PROBE_TIMEOUT.as_secs();
    let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
    let addresses = tokio::time::timeout_at(deadline, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| format!("host `{host}` did not resolve within {seconds} s"))?
        .map_err(|err| format!("cannot resolve host `{host}` ({err})"))?;
    let mut last_error = None;
    for address in addresses {
        match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(address)).await {
            Ok(Ok(_connected)) => return Ok(()),
            Ok(Err(err)) => last_error = Some(err),
            Err(_) => return Err(format!("no answer from {shown} within {seconds} s")),
        }
    }
    Err(match last_error {
        Some(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("connection refused ({shown})")
        }
        Some(err) => format!("cannot connect to {shown}: {err}"),
        None => format!("host `{host}` resolved to no address"),
    })
}

/// The error for a server that could not be reached.
fn connect_error(url: &str, reason: String) -> Error {
    Error::Connect {
        context: format!("cannot connect to {}", crate::redact::redact_url(url)),
        reason,
        hint: password_hint(url),
    }
}

/// A failed connection keeps its error, unless the URL looks mistyped: then it becomes a
/// [`Error::Connect`] carrying the driver's reason and the hint.
fn with_password_hint(url: &str, err: Error) -> Error {
    if password_hint(url).is_empty() {
        return err;
    }
    let reason = match &err {
        Error::Database { cause, .. } => {
            crate::error::without_line_suffix(&cause.to_string()).to_owned()
        }
        other => other.to_string(),
    };
    connect_error(url, reason)
}

/// `; hint: ...` when the user information of `url` seems to hold an unescaped `@` or
/// `/`: more than one `@` before the query, or an `@` after the first `/` of the
/// authority. Empty otherwise.
pub fn password_hint(url: &str) -> String {
    let Some((_, rest)) = url.split_once("://") else {
        return String::new();
    };
    let before_query = rest.split(['?', '#']).next().unwrap_or(rest);
    let at_signs = before_query.matches('@').count();
    let at_after_slash = before_query
        .split_once('/')
        .is_some_and(|(_, path)| path.contains('@'));
    if at_signs > 1 || at_after_slash {
        "; hint: the URL's password seems to hold a `@` or `/`: percent-encode such \
         characters in the user and password (`@` is %40, `/` is %2F, `:` is %3A, `#` is \
         %23, `?` is %3F), so that a password `s3cr@t` is written `s3cr%40t`"
            .to_owned()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_targets_servers_only() {
        assert_eq!(
            probe_target("postgres://u:p@db.example:6000/x"),
            Some(("db.example".into(), 6000))
        );
        assert_eq!(
            probe_target("mariadb://root@127.0.0.1/x"),
            Some(("127.0.0.1".into(), 3306))
        );
        assert_eq!(
            probe_target("postgres://[::1]/x"),
            Some(("::1".into(), 5432))
        );
        assert_eq!(probe_target("sqlite:app.db"), None);
        assert_eq!(probe_target("postgres:///x?host=/run/postgresql"), None);
        assert_eq!(probe_target("postgres://localhost/x?port=5433"), None);
    }

    #[test]
    fn password_hint_spots_unescaped_at_signs() {
        assert!(password_hint("postgres://u:p%40ss@host/db").is_empty());
        assert!(password_hint("postgres://u:pass@host/db").is_empty());
        assert!(password_hint("postgres://u:p@ss@host/db").contains("%40"));
        assert!(password_hint("mysql://u:p/ss@host/db").contains("%40"));
        assert!(password_hint("postgres://host/db?password=a@b").is_empty());
        assert!(password_hint("sqlite:a@b.db").is_empty());
    }

    #[tokio::test]
    async fn a_refused_port_is_reported_at_once() {
        let started = std::time::Instant::now();
        let err = probe("postgres://u:secret@127.0.0.1:1/db")
            .await
            .unwrap_err();
        assert_eq!(err, "connection refused (127.0.0.1:1)");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
