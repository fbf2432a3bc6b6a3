//! Which PostgreSQL server a source talks to, through what, and finding it again.
//!
//! - **Several hosts.** A `url` may list hosts as libpq writes them, in the authority
//!   (`postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write`) or in the query
//!   (`postgres://u:p@/db?host=h1,h2&port=5432,5433`), read by libpq's rules
//!   ([`postgres_hosts`]). Each host gets its own sqlx options (sqlx takes one host); the
//!   user, password, database and every other parameter are shared. `icq migrate` makes
//!   the same choice of server for its one connection ([`connect_options`]). `target_session_attrs` may be `any`, `read-write` or
//!   `primary` (the last two mean the same to icq: a server that accepts writes); with
//!   several hosts and no `target_session_attrs`, icq wants a writable server, since a
//!   queue must write.
//! - **Failover.** With several hosts a watcher task owns the choice of server. Anything
//!   that looks like a lost server — an I/O error, a pool timeout, a read-only error
//!   (SQLSTATE 25006), a server shutting down, a new connection that finds the server in
//!   recovery, a processor's call that got no answer within its deadline (the pool
//!   retries a refused connect silently until then) — pokes it; it then tries the current
//!   host and the others, in list order, until one accepts connections and is writable,
//!   points every pool of the source at it ([`sqlx::Pool::set_connect_options`]) and
//!   closes the connections made before the switch as they come back to be used
//!   (`before_acquire` on their age). Until a
//!   writable server exists it keeps looking, at most every [`RESCAN_MAX`]; statements
//!   fail meanwhile and the processor retries them, so processing resumes without a
//!   restart. Every new connection of a source that wants a writable server checks it
//!   (`pg_is_in_recovery()`), so neither a pool nor the LISTEN connection ever settles on
//!   a standby.
//! - **Poolers.** sqlx's `extra_float_digits` startup parameter is never sent (PgBouncer
//!   refuses unknown startup parameters unless told to ignore them; icq reads every value
//!   in binary, where the setting changes nothing), and the processor's
//!   `plan_cache_mode` and `jit` are a `SET` after connecting rather than the `options`
//!   startup parameter, for the same reason. So PgBouncer in session mode works as a
//!   direct connection. In transaction mode ([`Pooler::Transaction`]) no statement is
//!   named (the statement cache is off), and the driver runs each statement in its own
//!   explicit transaction, so the parse and the execution that sqlx sends in two
//!   round trips reach the same server connection. Without that setting a transaction
//!   pooler is detected when the source connects ([`transaction_pooling`]) and refused
//!   with an error naming the setting.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Row};
use tokio::sync::Notify;

use crate::engine::url::{PgHost, PgHosts, postgres_hosts};
use crate::error::{Error, Result};
use crate::redact::{redact_text, redact_url};
use crate::settings::Pooler;

/// The longest the watcher waits between two looks for a writable server.
pub(super) const RESCAN_MAX: Duration = Duration::from_millis(500);

/// How long one look at one server may take (connect and ask).
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The servers a source accepts (`target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionAttrs {
    /// The first server that accepts a connection.
    Any,
    /// A server that accepts writes (not in recovery, not read-only by default).
    ReadWrite,
}

/// One server of a URL's host list.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `host:port` as written in the URL, for messages.
    pub(crate) label: String,
    pub(crate) options: PgConnectOptions,
}

/// The servers a URL names, in its order.
#[derive(Debug, Clone)]
pub(crate) struct Servers {
    pub(crate) hosts: Vec<Host>,
    pub(crate) attrs: SessionAttrs,
}

/// Parses a PostgreSQL URL that may list several hosts (libpq's forms, see
/// [`postgres_hosts`]) into one set of sqlx options per host, set up for `pooler`.
pub(crate) fn parse(url: &str, pooler: Pooler) -> Result<Servers> {
    let shown = || redact_url(url);
    let listed =
        postgres_hosts(url).map_err(|why| Error::invalid(format!("{}: {why}", shown())))?;
    let Some(PgHosts {
        hosts: one_host_urls,
        session_attrs,
    }) = listed
    else {
        let options =
            PgConnectOptions::from_str(url).map_err(Error::db(format!("parsing {}", shown())))?;
        return Ok(Servers {
            hosts: vec![Host {
                label: String::new(),
                options: tune(options, pooler),
            }],
            attrs: SessionAttrs::Any,
        });
    };
    let mut hosts = Vec::with_capacity(one_host_urls.len());
    let several = one_host_urls.len() > 1;
    for PgHost { label, url: one } in one_host_urls {
        // A host is named only when the URL lists several: a setting is the URL's.
        let context = if several {
            format!("parsing host `{label}` of {}", shown())
        } else {
            format!("parsing {}", shown())
        };
        let options = PgConnectOptions::from_str(&one).map_err(Error::db(context))?;
        hosts.push(Host {
            label,
            options: tune(options, pooler),
        });
    }
    let attrs = match session_attrs.as_deref() {
        None if hosts.len() > 1 => SessionAttrs::ReadWrite,
        None | Some("any") => SessionAttrs::Any,
        Some("read-write" | "primary") => SessionAttrs::ReadWrite,
        Some(other) => {
            return Err(Error::invalid(format!(
                "{}: `target_session_attrs={other}` is not supported: icq takes `any`, \
                 `read-write` or `primary` (a queue must write)",
                shown()
            )));
        }
    };
    Ok(Servers { hosts, attrs })
}

/// The options icq sets on every PostgreSQL connection: no `extra_float_digits` startup
/// parameter (PgBouncer refuses it; icq decodes binary values), and in transaction
/// pooling no named statements.
fn tune(options: PgConnectOptions, pooler: Pooler) -> PgConnectOptions {
    let options = options.extra_float_digits(None);
    match pooler {
        Pooler::Session => options,
        Pooler::Transaction => options.statement_cache_capacity(0),
    }
}

/// Whether `conn`'s server refuses writes: in recovery (a standby) or read-only by
/// default. The simple protocol, so it works through any pooler.
async fn read_only(conn: &mut PgConnection) -> std::result::Result<bool, sqlx::Error> {
    let row = sqlx::raw_sql(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(&mut *conn)
    .await?;
    row.try_get::<bool, _>(0)
}

/// Whether `err` says the server went away or cannot take writes: what makes a source
/// with several hosts look for another one.
pub(crate) fn is_lost_server(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 25006 read_only_sql_transaction; 57P01-03 the server is shutting down or
            // starting; class 08 connection exceptions.
            matches!(&*code, "25006" | "57P01" | "57P02" | "57P03") || code.starts_with("08")
        }),
        _ => false,
    }
}

/// Connects to `host` and checks it is usable for `attrs`; the reason when not.
async fn check(host: &Host, attrs: SessionAttrs) -> std::result::Result<(), String> {
    let mut conn = tokio::time::timeout(CHECK_TIMEOUT, PgConnection::connect_with(&host.options))
        .await
        .map_err(|_| format!("no answer within {CHECK_TIMEOUT:?}"))?
        .map_err(|err| redact_text(&err.to_string()))?;
    let verdict = match attrs {
        SessionAttrs::Any => Ok(()),
        SessionAttrs::ReadWrite => {
            match tokio::time::timeout(CHECK_TIMEOUT, read_only(&mut conn)).await {
                Ok(Ok(false)) => Ok(()),
                Ok(Ok(true)) => Err("read-only (in recovery)".to_string()),
                Ok(Err(err)) => Err(redact_text(&err.to_string())),
                Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
            }
        }
    };
    let _ = conn.close().await;
    verdict
}

/// The index of the server to start on: the first of the list usable for the URL's
/// `target_session_attrs`, each looked at in turn; a single host without
/// `target_session_attrs` is taken as written (its connection reports what is wrong with
/// it). The error names every host and why it was passed over.
async fn choose(url: &str, servers: &Servers) -> Result<usize> {
    if servers.hosts.len() == 1 && servers.attrs == SessionAttrs::Any {
        return Ok(0);
    }
    let mut reasons = Vec::new();
    for (i, host) in servers.hosts.iter().enumerate() {
        match check(host, servers.attrs).await {
            Ok(()) => return Ok(i),
            Err(reason) => reasons.push(format!("{} ({reason})", host.label)),
        }
    }
    Err(Error::Connect {
        context: format!("connecting to {}", redact_url(url)),
        reason: format!(
            "no {}server among the URL's hosts: {}",
            if servers.attrs == SessionAttrs::ReadWrite {
                "writable "
            } else {
                ""
            },
            reasons.join(", ")
        ),
        hint: String::new(),
    })
}

/// The options for one connection to the server `url` names: with several hosts (libpq's
/// forms) or `target_session_attrs`, the first usable one, as a source would pick it
/// (`icq migrate` applies its migrations there).
pub(crate) async fn connect_options(url: &str) -> Result<PgConnectOptions> {
    let servers = parse(url, Pooler::Session)?;
    let chosen = choose(url, &servers).await?;
    Ok(servers.hosts[chosen].options.clone())
}

/// One source's choice of server, shared by its pools, its LISTEN task and the watcher.
pub(crate) struct Failover {
    servers: Servers,
    current: AtomicUsize,
    /// When the pools last moved to another server; older connections are not reused.
    switched: Arc<Mutex<Option<Instant>>>,
    /// Wakes the watcher: something looked like a lost server.
    poke: Arc<Notify>,
    pools: Mutex<Vec<PgPool>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Failover {
    /// Picks the server to start on: the first of the list usable for the URL's
    /// `target_session_attrs` (a single host is taken as written, and its pool reports
    /// what is wrong with it). Starts the watcher when there are several hosts.
    pub(crate) async fn start(url: &str, servers: Servers) -> Result<Arc<Failover>> {
        let current = choose(url, &servers).await?;
        let failover = Arc::new(Failover {
            current: AtomicUsize::new(current),
            servers,
            switched: Arc::new(Mutex::new(None)),
            poke: Arc::new(Notify::new()),
            pools: Mutex::new(Vec::new()),
            watcher: Mutex::new(None),
        });
        if failover.servers.hosts.len() > 1 {
            failover.spawn_watcher();
        }
        Ok(failover)
    }

    /// The options of the server in use now.
    pub(crate) fn current_options(&self) -> PgConnectOptions {
        let i = self.current.load(Ordering::Acquire);
        self.servers.hosts[i.min(self.servers.hosts.len() - 1)]
            .options
            .clone()
    }

    /// The host in use now, as written in the URL (empty for a URL without hosts).
    pub(crate) fn current_label(&self) -> String {
        let i = self.current.load(Ordering::Acquire);
        self.servers.hosts[i.min(self.servers.hosts.len() - 1)]
            .label
            .clone()
    }

    /// Pool options with the checks every connection of this source gets: the server is
    /// writable when the URL asks for it (else the connection fails and the watcher
    /// looks for another server), the work session's settings (`super::WORK_SESSION`) for
    /// the processor's own connections outside transaction pooling, and, with several
    /// hosts, connections
    /// made before a switch are closed instead of reused.
    pub(crate) fn pool_options(
        &self,
        max: u32,
        acquire: Duration,
        work: bool,
        pooler: Pooler,
    ) -> PgPoolOptions {
        let attrs = self.servers.attrs;
        let poke = self.poke.clone();
        let work_session = work && pooler == Pooler::Session;
        // The pool every engine gets (no ping before acquire; a connection abandoned by
        // a call's deadline is checked when it comes back), with PostgreSQL's checks.
        let pool = super::super::ConnectOptions {
            max_connections: max,
            acquire_timeout: acquire,
            ..super::super::ConnectOptions::default()
        };
        let mut options = pool
            .pool::<sqlx::Postgres>()
            .after_connect(move |conn, _meta| {
                let poke = poke.clone();
                Box::pin(async move {
                    if attrs == SessionAttrs::ReadWrite && read_only(conn).await? {
                        poke.notify_one();
                        return Err(sqlx::Error::Protocol(
                            "the server is read-only (in recovery): looking for the writable one"
                                .into(),
                        ));
                    }
                    if work_session {
                        sqlx::raw_sql(super::WORK_SESSION)
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            });
        if self.servers.hosts.len() > 1 {
            let switched = self.switched.clone();
            options = options.before_acquire(move |_conn, meta| {
                let since = switched
                    .lock()
                    .ok()
                    .and_then(|at| *at)
                    .map(|at| at.elapsed());
                let before_switch = since.is_some_and(|since| meta.age > since);
                Box::pin(async move { Ok(!before_switch) })
            });
        }
        options
    }

    /// Registers a pool to follow the server when the watcher switches.
    pub(crate) fn adopt(&self, pool: &PgPool) {
        if let Ok(mut pools) = self.pools.lock() {
            pools.push(pool.clone());
        }
    }

    /// Notes an error: one that looks like a lost server wakes the watcher.
    pub(crate) fn saw(&self, err: &sqlx::Error) {
        if self.servers.hosts.len() > 1 && is_lost_server(err) {
            self.poke.notify_one();
        }
    }

    /// Wakes the watcher (the LISTEN connection was lost, or a call got no answer).
    pub(crate) fn poke(&self) {
        if self.servers.hosts.len() > 1 {
            self.poke.notify_one();
        }
    }

    /// Stops the watcher.
    pub(crate) fn stop(&self) {
        if let Ok(mut watcher) = self.watcher.lock()
            && let Some(task) = watcher.take()
        {
            task.abort();
        }
    }

    fn spawn_watcher(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let poke = self.poke.clone();
        let task = tokio::spawn(async move {
            loop {
                poke.notified().await;
                let mut delay = Duration::from_millis(50);
                for round in 0u64.. {
                    let Some(this) = weak.upgrade() else {
                        return;
                    };
                    if this.look().await {
                        break;
                    }
                    // Said once, then every 20 rounds (about 10 s): an outage is long.
                    if round % 20 == 0 {
                        tracing::warn!(
                            hosts = this.servers.hosts.len(),
                            "no writable PostgreSQL server among the URL's hosts yet; looking again"
                        );
                    }
                    drop(this);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RESCAN_MAX);
                }
            }
        });
        if let Ok(mut watcher) = self.watcher.lock() {
            *watcher = Some(task);
        }
    }

    /// Looks for a usable server, the current one first, then the list in order; moves
    /// the pools to it when it is another. False when none is usable yet.
    async fn look(&self) -> bool {
        let n = self.servers.hosts.len();
        let current = self.current.load(Ordering::Acquire);
        let order = std::iter::once(current).chain((0..n).filter(|&i| i != current));
        for i in order {
            let host = &self.servers.hosts[i];
            match check(host, self.servers.attrs).await {
                Ok(()) => {
                    if i != current {
                        self.switch(current, i);
                    }
                    return true;
                }
                Err(reason) => {
                    tracing::debug!(host = %host.label, reason, "not usable");
                }
            }
        }
        false
    }

    fn switch(&self, from: usize, to: usize) {
        let host = &self.servers.hosts[to];
        if let Ok(mut at) = self.switched.lock() {
            *at = Some(Instant::now());
        }
        self.current.store(to, Ordering::Release);
        if let Ok(pools) = self.pools.lock() {
            for pool in pools.iter() {
                pool.set_connect_options(host.options.clone());
            }
        }
        tracing::warn!(
            from = %self.servers.hosts[from].label,
            to = %host.label,
            "PostgreSQL failover: now using the writable server {}",
            host.label
        );
    }
}

/// Whether the server behind `pool` is a pooler in transaction mode (PgBouncer's
/// `pool_mode = transaction`): a second client holding a transaction open gets the
/// server connection the first client used a moment ago, or the first client's next
/// statement runs on another server connection. Neither happens on a direct connection
/// or in session mode, where a client keeps its server connection. PgBouncer hands out
/// the most recently used server connection first, so the first test is decisive there.
///
/// The second client comes from `seconds` when that pool may hold two connections (icq's
/// own processor pool, which opens more than one anyway, so the check costs no login of
/// its own: a replica's start is a row of serial round trips, paid by every replica of a
/// fleet), and is a connection of its own otherwise (an application's pool may be full).
pub(crate) async fn transaction_pooling(
    pool: &PgPool,
    seconds: Option<&PgPool>,
    options: &PgConnectOptions,
) -> std::result::Result<bool, sqlx::Error> {
    async fn pid(conn: &mut PgConnection) -> std::result::Result<i32, sqlx::Error> {
        sqlx::raw_sql("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?
            .try_get::<i32, _>(0)
    }
    /// The backend of `second` inside a transaction, then `first`'s backend again.
    async fn interleaved(
        first: &mut PgConnection,
        second: &mut PgConnection,
    ) -> std::result::Result<(i32, i32), sqlx::Error> {
        sqlx::raw_sql("BEGIN").execute(&mut *second).await?;
        let other = pid(second).await?;
        let after = pid(first).await?;
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *second).await;
        Ok((other, after))
    }
    let mut first = pool.acquire().await?;
    let before = pid(&mut first).await?;
    let (other, after) = match seconds.filter(|pool| pool.options().get_max_connections() >= 2) {
        Some(seconds) => interleaved(&mut first, &mut *seconds.acquire().await?).await?,
        None => {
            let mut second = PgConnection::connect_with(options).await?;
            let seen = interleaved(&mut first, &mut second).await;
            let _ = second.close().await;
            seen?
        }
    };
    Ok(other == before || after != before)
}

/// Logs in to the server of `url` once, on a connection of its own, and returns its
/// refusal, if it refuses for a reason that will not pass while the pool waits (see
/// `probe::handshake`): `None` when the login works, the server is starting up (57P03),
/// or the login fails otherwise (the pool reports that itself).
///
/// The login sends what icq's pools send: no `extra_float_digits` (PgBouncer refuses the
/// parameter, and the probe ran exactly when the pool was slow to connect — a loaded
/// machine — and reported that refusal as the reason).
pub(crate) async fn login_refusal(url: &str) -> Option<Error> {
    let options = PgConnectOptions::from_str(url)
        .ok()?
        .extra_float_digits(None);
    let login = tokio::time::timeout(
        crate::engine::probe::PROBE_TIMEOUT,
        PgConnection::connect_with(&options),
    )
    .await;
    match login {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            None
        }
        Ok(Err(sqlx::Error::Database(db))) if db.code().as_deref() != Some("57P03") => {
            Some(Error::Database {
                context: format!("connecting to {}", crate::redact::redact_url(url)),
                cause: sqlx::Error::Database(db),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_share_everything_but_the_host() {
        let servers = parse(
            "postgres://app:pw@h1:5432,h2:5433,[::1]/orders?target_session_attrs=read-write&sslmode=disable",
            Pooler::Session,
        )
        .unwrap();
        assert_eq!(servers.attrs, SessionAttrs::ReadWrite);
        let shown: Vec<_> = servers
            .hosts
            .iter()
            .map(|h| {
                (
                    h.label.as_str(),
                    h.options.get_host().to_string(),
                    h.options.get_port(),
                    h.options.get_database().map(str::to_string),
                    h.options.get_username().to_string(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "h1:5432",
                    "h1".into(),
                    5432,
                    Some("orders".into()),
                    "app".into()
                ),
                (
                    "h2:5433",
                    "h2".into(),
                    5433,
                    Some("orders".into()),
                    "app".into()
                ),
                (
                    "[::1]",
                    "[::1]".into(),
                    5432,
                    Some("orders".into()),
                    "app".into()
                ),
            ]
        );
    }

    #[test]
    fn session_attrs_default_to_writable_with_several_hosts_only() {
        let one = parse("postgres://u@h/db", Pooler::Session).unwrap();
        assert_eq!((one.hosts.len(), one.attrs), (1, SessionAttrs::Any));
        let two = parse("postgres://u@h1,h2/db", Pooler::Session).unwrap();
        assert_eq!((two.hosts.len(), two.attrs), (2, SessionAttrs::ReadWrite));
        let any = parse(
            "postgres://u@h1,h2/db?target_session_attrs=any",
            Pooler::Session,
        )
        .unwrap();
        assert_eq!(any.attrs, SessionAttrs::Any);
        let err = parse(
            "postgres://u:secret@h1,h2/db?target_session_attrs=standby",
            Pooler::Session,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`target_session_attrs=standby` is not supported"),
            "{err}"
        );
        assert!(!err.contains("secret"), "{err}");
        let empty = parse("postgres://u@h1,,h2/db", Pooler::Session).unwrap_err();
        assert!(empty.to_string().contains("empty host"), "{empty}");
    }

    #[test]
    fn lost_servers_are_recognised() {
        assert!(is_lost_server(&sqlx::Error::PoolTimedOut));
        assert!(is_lost_server(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        assert!(!is_lost_server(&sqlx::Error::RowNotFound));
    }
}
