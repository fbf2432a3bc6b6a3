//! Which MariaDB/MySQL server a source talks to, and finding another when it goes: a
//! multi-primary cluster (MariaDB Galera) whose nodes all take writes.
//!
//! - **Several hosts.** A `url` may list hosts in its authority
//!   (`mysql://u:p@g1:3306,g2:3307,g3:3308/db`, read by [`mysql_hosts`]); each gets its
//!   own sqlx options (sqlx takes one host), the user, password, database and parameters
//!   shared. A source uses one node at a time: the first of the list that accepts a
//!   connection and, on a Galera node, is ready for writes ([`check`]). `icq migrate`
//!   makes the same choice for its one connection ([`connect_options`]).
//! - **Galera's state.** A Galera node that is not in the primary component (it lost
//!   quorum: `wsrep_ready` is `OFF`) refuses statements, and one that is not synced
//!   (`wsrep_local_state` other than 4: joining, a donor, desynced) serves stale reads.
//!   Neither is chosen, and every new connection of a source listing several hosts checks
//!   it (two `SHOW GLOBAL …` round trips once per connection; a server without
//!   `wsrep_on` is taken as it is).
//! - **Failover.** With several hosts a watcher task keeps one connection of its own to
//!   the node in use and asks it for its state every [`WATCH_EVERY`]. When that fails
//!   (the node died, lost quorum or left the cluster) it tries the node again and then the
//!   others in list order, points the pool at the first usable one
//!   ([`sqlx::Pool::set_connect_options`]) and closes the connections made before the
//!   switch as they come back to be used. Statements on the lost node fail meanwhile and
//!   the processor retries them; a claim or stamp whose commit the lost node never
//!   confirmed either reached the cluster whole (its lease or outcome stands) or not at
//!   all, so the retry on the new node finds the row as the cluster has it.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Row};

use crate::engine::url::{MySqlHost, mysql_hosts};
use crate::error::{Error, Result};
use crate::redact::{redact_text, redact_url};

/// How often the watcher asks the node in use for its state.
pub(super) const WATCH_EVERY: Duration = Duration::from_millis(250);

/// How long one look at one node may take (connect and ask).
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest the watcher waits between two looks for a usable node.
const RESCAN_MAX: Duration = Duration::from_millis(500);

/// One server of a URL's host list.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `host:port` as written in the URL, for messages.
    pub(crate) label: String,
    pub(crate) options: MySqlConnectOptions,
}

/// `mariadb://` as `mysql://`: sqlx knows the one scheme.
pub(crate) fn normalized(url: &str) -> String {
    match url.strip_prefix("mariadb:") {
        Some(rest) => format!("mysql:{rest}"),
        None => url.to_owned(),
    }
}

/// The servers `url` names, in its order, with their sqlx options.
pub(crate) fn parse(url: &str) -> Result<Vec<Host>> {
    let shown = || redact_url(url);
    let listed = mysql_hosts(&normalized(url))
        .map_err(|why| Error::invalid(format!("{}: {why}", shown())))?;
    let several = listed.len() > 1;
    listed
        .into_iter()
        .map(|MySqlHost { label, url: one }| {
            let context = if several {
                format!("parsing host `{label}` of {}", shown())
            } else {
                format!("parsing {}", shown())
            };
            let options = MySqlConnectOptions::from_str(&one).map_err(Error::db(context))?;
            Ok(Host { label, options })
        })
        .collect()
}

/// Why the server behind `conn` cannot take a source's writes (a Galera node out of the
/// primary component or not synced), or `None` when it can: a server without Galera
/// (`wsrep_on` absent or `OFF`) always can.
pub(crate) async fn galera_refusal(
    conn: &mut MySqlConnection,
) -> std::result::Result<Option<String>, sqlx::Error> {
    let on = sqlx::raw_sql("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        .fetch_all(&mut *conn)
        .await?;
    let on = on
        .first()
        .and_then(|row| row.try_get::<String, _>(1).ok())
        .is_some_and(|value| value.eq_ignore_ascii_case("ON"));
    if !on {
        return Ok(None);
    }
    let rows = sqlx::raw_sql(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state')",
    )
    .fetch_all(&mut *conn)
    .await?;
    let (mut ready, mut state) = (None, None);
    for row in rows {
        let (name, value) = (row.try_get::<String, _>(0)?, row.try_get::<String, _>(1)?);
        match name.to_ascii_lowercase().as_str() {
            "wsrep_ready" => ready = Some(value),
            "wsrep_local_state" => state = Some(value),
            _ => {}
        }
    }
    if !ready
        .as_deref()
        .is_some_and(|r| r.eq_ignore_ascii_case("ON"))
    {
        return Ok(Some(format!(
            "Galera node not ready (wsrep_ready={}): not in the primary component",
            ready.as_deref().unwrap_or("?")
        )));
    }
    if state.as_deref() != Some("4") {
        return Ok(Some(format!(
            "Galera node not synced (wsrep_local_state={}: joining, a donor or desynced)",
            state.as_deref().unwrap_or("?")
        )));
    }
    Ok(None)
}

/// Connects to `host` and checks it can take writes; the reason when not.
async fn check(host: &Host) -> std::result::Result<(), String> {
    let mut conn =
        tokio::time::timeout(CHECK_TIMEOUT, MySqlConnection::connect_with(&host.options))
            .await
            .map_err(|_| format!("no answer within {CHECK_TIMEOUT:?}"))?
            .map_err(|err| redact_text(&err.to_string()))?;
    let verdict = match tokio::time::timeout(CHECK_TIMEOUT, galera_refusal(&mut conn)).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(reason))) => Err(reason),
        Ok(Err(err)) => Err(redact_text(&err.to_string())),
        Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
    };
    let _ = conn.close().await;
    verdict
}

/// The index of the server to start on: the first of the list that can take writes; a
/// single host is taken as written (its pool reports what is wrong with it). The error
/// names every host and why it was passed over.
async fn choose(url: &str, hosts: &[Host]) -> Result<usize> {
    if hosts.len() == 1 {
        return Ok(0);
    }
    let mut reasons = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        match check(host).await {
            Ok(()) => return Ok(i),
            Err(reason) => reasons.push(format!("{} ({reason})", host.label)),
        }
    }
    Err(Error::Connect {
        context: format!("connecting to {}", redact_url(url)),
        reason: format!(
            "no usable server among the URL's hosts: {}",
            reasons.join(", ")
        ),
        hint: String::new(),
    })
}

/// The options for one connection to the server `url` names: with several hosts, the
/// first that can take writes, as a source would pick it (`icq migrate` applies its
/// migrations there).
pub(crate) async fn connect_options(url: &str) -> Result<MySqlConnectOptions> {
    let hosts = parse(url)?;
    let chosen = choose(url, &hosts).await?;
    Ok(hosts[chosen].options.clone())
}

/// One source's choice of server among several hosts, shared by its pool and watcher.
pub(crate) struct Failover {
    hosts: Vec<Host>,
    current: AtomicUsize,
    /// When the pool last moved to another server; older connections are not reused.
    switched: Arc<Mutex<Option<Instant>>>,
    pool: Mutex<Option<MySqlPool>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Failover {
    /// Picks the server to start on (see [`choose`]) among `hosts` (several: a URL naming
    /// one host needs no failover).
    pub(crate) async fn start(url: &str, hosts: Vec<Host>) -> Result<Arc<Failover>> {
        let current = choose(url, &hosts).await?;
        Ok(Arc::new(Failover {
            current: AtomicUsize::new(current),
            hosts,
            switched: Arc::new(Mutex::new(None)),
            pool: Mutex::new(None),
            watcher: Mutex::new(None),
        }))
    }

    /// The options of the server in use now.
    pub(crate) fn current_options(&self) -> MySqlConnectOptions {
        self.hosts[self.current.load(Ordering::Acquire)]
            .options
            .clone()
    }

    /// `pool` with the checks of a source listing several hosts: a new connection to a
    /// Galera node that cannot take writes fails (the watcher looks for another node), and
    /// connections made before a switch are closed instead of reused.
    pub(crate) fn pool_options(&self, pool: MySqlPoolOptions) -> MySqlPoolOptions {
        let switched = self.switched.clone();
        pool.before_acquire(move |_conn, meta| {
            let since = switched
                .lock()
                .ok()
                .and_then(|at| *at)
                .map(|at| at.elapsed());
            let before_switch = since.is_some_and(|since| meta.age > since);
            Box::pin(async move { Ok(!before_switch) })
        })
    }

    /// Follows `pool` to the node in use and starts the watcher.
    pub(crate) fn adopt(self: &Arc<Self>, pool: &MySqlPool) {
        if let Ok(mut slot) = self.pool.lock() {
            *slot = Some(pool.clone());
        }
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(watch(weak));
        if let Ok(mut watcher) = self.watcher.lock() {
            *watcher = Some(task);
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

    /// Looks for a usable server, the current one first, then the list in order; moves
    /// the pool to it when it is another. False when none is usable yet.
    async fn look(&self) -> bool {
        let n = self.hosts.len();
        let current = self.current.load(Ordering::Acquire);
        let order = std::iter::once(current).chain((0..n).filter(|&i| i != current));
        for i in order {
            let host = &self.hosts[i];
            match check(host).await {
                Ok(()) => {
                    if i != current {
                        self.switch(current, i);
                    }
                    return true;
                }
                Err(reason) => {
                    tracing::debug!(host = %host.label, reason, "MariaDB/MySQL server not usable");
                }
            }
        }
        false
    }

    fn switch(&self, from: usize, to: usize) {
        let host = &self.hosts[to];
        if let Ok(mut at) = self.switched.lock() {
            *at = Some(Instant::now());
        }
        self.current.store(to, Ordering::Release);
        if let Ok(pool) = self.pool.lock()
            && let Some(pool) = pool.as_ref()
        {
            pool.set_connect_options(host.options.clone());
        }
        tracing::warn!(
            from = %self.hosts[from].label,
            to = %host.label,
            "MariaDB/MySQL failover: now using {}",
            host.label
        );
    }
}

impl Drop for Failover {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The watcher: asks the node in use for its state every [`WATCH_EVERY`] on a connection
/// of its own; when that fails, looks for a usable node until one is found. Ends when
/// the source is gone.
async fn watch(failover: Weak<Failover>) {
    let mut conn: Option<MySqlConnection> = None;
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let Some(this) = failover.upgrade() else {
            return;
        };
        if conn.is_none() {
            let options = this.current_options();
            conn = tokio::time::timeout(CHECK_TIMEOUT, MySqlConnection::connect_with(&options))
                .await
                .ok()
                .and_then(std::result::Result::ok);
        }
        let usable = match conn.as_mut() {
            Some(c) => matches!(
                tokio::time::timeout(CHECK_TIMEOUT, galera_refusal(c)).await,
                Ok(Ok(None))
            ),
            None => false,
        };
        if usable {
            continue;
        }
        // The watcher's own connection goes with the node it watched.
        if let Some(c) = conn.take() {
            drop(c);
        }
        let mut delay = Duration::from_millis(50);
        for round in 0u64.. {
            if this.look().await {
                break;
            }
            // Said once, then every 20 rounds (about 10 s): an outage is long.
            if round % 20 == 0 {
                tracing::warn!(
                    hosts = this.hosts.len(),
                    "no usable MariaDB/MySQL server among the URL's hosts yet; looking again"
                );
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RESCAN_MAX);
            if failover.strong_count() <= 1 {
                return;
            }
        }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn each_host_gets_its_own_options_and_the_rest_is_shared() {
        let hosts = parse("mariadb://app:s3cret@g1:3306,g2:3307/shop").unwrap();
        let labels: Vec<&str> = hosts.iter().map(|h| h.label.as_str()).collect();
        assert_eq!(labels, ["g1:3306", "g2:3307"]);
        let err = parse("mysql://app:s3cret@g1,,g3/shop").err().unwrap();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert_eq!(parse("mysql://app@db/shop").unwrap().len(), 1);
    }
}

/// Needs the MariaDB server, like the driver conformance suite: built with it.
#[cfg(all(test, feature = "driver-suite"))]
mod tests {
    use super::*;

    fn server() -> String {
        std::env::var("ICQ_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
    }

    /// A host that refuses connections listed first is passed over; a server without
    /// Galera is taken as it is, and a URL where no host answers names each one's reason.
    #[tokio::test]
    async fn the_first_usable_host_of_the_list_is_chosen() {
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let live = server();
        let authority_end = live["mysql://".len()..]
            .find('/')
            .map(|i| i + "mysql://".len())
            .unwrap();
        let hosts_start = live[..authority_end]
            .rfind('@')
            .map_or("mysql://".len(), |at| at + 1);
        let listed = format!(
            "{}127.0.0.1:{dead},{}",
            &live[..hosts_start],
            &live[hosts_start..]
        );
        let hosts = parse(&listed).unwrap();
        assert_eq!(choose(&listed, &hosts).await.unwrap(), 1);
        let mut conn = MySqlConnection::connect(&live).await.unwrap();
        assert_eq!(galera_refusal(&mut conn).await.unwrap(), None);
        let none = format!("mysql://root@127.0.0.1:{dead},127.0.0.1:{dead}/test");
        let err = choose(&none, &parse(&none).unwrap()).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("no usable server among the URL's hosts"),
            "{err}"
        );
    }
}
