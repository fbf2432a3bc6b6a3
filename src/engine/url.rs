//! A database URL made fit for a driver, before the driver sees it: the one place every
//! connection's URL passes through ([`super::connect`] and `icq migrate`).
//!
//! sqlx's PostgreSQL driver logs every query parameter it does not know, value and all
//! (`ignoring unrecognized connect parameter key=PassWord value=<secret>`), and a log
//! line is no place for a password. So [`for_driver`] removes from a PostgreSQL URL every
//! parameter whose name looks secret (see [`crate::redact::is_secret_name`]) but that
//! sqlx does not take: `PassWord` (libpq parameter names are case-sensitive, and sqlx
//! ignores it), `sslpassword` (sqlx cannot decrypt a client key), `api_token`, ... It
//! logs a warning naming the parameter, never its value. The parameters sqlx takes
//! (`password`, `options`, `options[...]`) and every other one (`target_session_attrs`,
//! which icq's own PostgreSQL code reads) are passed on untouched, byte for byte.
//!
//! The URL is edited as text, never re-serialized: a libpq multi-host URL
//! (`postgres://h1:5432,h2:5433/db`) is not a URL the `url` crate accepts, and every byte
//! of the others stays as written.
//!
//! [`postgres_hosts`] reads the servers a PostgreSQL URL names by libpq's rules, in both
//! of libpq's forms: hosts in the authority (`postgres://h1:5432,h2:5433/db`) and hosts in
//! the query (`postgres:///db?host=h1,h2&port=5432,5433`, with `hostaddr` too), and cuts
//! it into one URL per server that sqlx can take (sqlx takes one host).

use std::borrow::Cow;

use crate::ident::Engine;

/// The query parameters sqlx's PostgreSQL driver takes (sqlx-postgres
/// `PgConnectOptions::parse_from_url`), besides `options[NAME]`.
const SQLX_POSTGRES_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// `url` as the engine's driver should see it: for PostgreSQL, without the
/// secret-looking parameters sqlx does not take (each dropped one is named in a warning,
/// without its value); any other URL unchanged.
///
/// E.g. `postgres://app@db/shop?PassWord=s3cret&sslpassword=k3y&sslmode=require` becomes
/// `postgres://app@db/shop?sslmode=require`.
pub(crate) fn for_driver(url: &str) -> Cow<'_, str> {
    if !matches!(Engine::from_url(url), Ok(Engine::Postgres)) {
        return Cow::Borrowed(url);
    }
    let (head, fragment) = match url.find('#') {
        Some(hash) => url.split_at(hash),
        None => (url, ""),
    };
    let Some((base, query)) = head.split_once('?') else {
        return Cow::Borrowed(url);
    };
    let mut kept: Vec<&str> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    for pair in query.split('&') {
        let name = decode(pair.split_once('=').map_or(pair, |(name, _)| name));
        if is_unknown_secret(&name) {
            dropped.push(name);
        } else {
            kept.push(pair);
        }
    }
    if dropped.is_empty() {
        return Cow::Borrowed(url);
    }
    for name in &dropped {
        tracing::warn!(
            parameter = %crate::redact::escape_for_log(name),
            "ignoring the connect parameter: sqlx's PostgreSQL driver does not take it \
             (parameter names are case-sensitive: a password goes in `password=` or the \
             URL's user information; `sslpassword` is not supported); its value is not used \
             or shown"
        );
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out.push_str(fragment);
    Cow::Owned(out)
}

/// The TLS modes each driver takes in `sslmode=` / `ssl-mode=` (in any case).
const PG_SSL_MODES: &[&str] = &[
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];
const MYSQL_SSL_MODES: &[&str] = &[
    "disabled",
    "preferred",
    "required",
    "verify_ca",
    "verify_identity",
];

/// Checks the query parameters of `url` whose values the driver would refuse with a bare
/// "error with configuration" (a TLS mode it does not know, a port that is not a
/// number, on PostgreSQL): the error names the parameter and the values it takes
/// ([`crate::Error::Invalid`], exit 2). Other URLs and parameters are left to the driver.
pub(crate) fn check_parameters(url: &str) -> crate::Result<()> {
    let (modes, postgres) = match Engine::from_url(url) {
        Ok(Engine::Postgres) => (PG_SSL_MODES, true),
        Ok(Engine::Mysql) => (MYSQL_SSL_MODES, false),
        _ => return Ok(()),
    };
    let head = url.split('#').next().unwrap_or(url);
    let Some((_, query)) = head.split_once('?') else {
        return Ok(());
    };
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (name, value) = (decode(name), decode_value(value));
        let problem = match name.as_str() {
            "sslmode" | "ssl-mode" if !modes.contains(&value.to_ascii_lowercase().as_str()) => {
                format!("is not a TLS mode: it takes {}", modes.join(", "))
            }
            "port" if postgres && value.split(',').any(|p| p.trim().parse::<u16>().is_err()) => {
                "is not a port: write a number from 1 to 65535".to_owned()
            }
            _ => continue,
        };
        return Err(crate::Error::invalid(format!(
            "{}: the parameter `{}={}` {problem}",
            crate::redact::redact_url(url),
            crate::redact::echo(&name),
            crate::redact::echo(&value)
        )));
    }
    Ok(())
}

/// One server of a PostgreSQL URL's host list: how to name it in messages, and a URL for it
/// alone that sqlx can parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgHost {
    /// `host:port` as written (`host (hostaddr addr):port` when both are given), never a
    /// secret.
    pub(crate) label: String,
    /// The URL with only this server: user information, database and every other
    /// parameter as written; `host`, `port`, `hostaddr` and `target_session_attrs` are
    /// this server's or gone.
    pub(crate) url: String,
}

/// The servers a PostgreSQL URL names, in its order, and its `target_session_attrs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgHosts {
    pub(crate) hosts: Vec<PgHost>,
    pub(crate) session_attrs: Option<String>,
}

/// The URL of each server `url` names, in order: one per host of a PostgreSQL URL listing
/// several (libpq's forms, see [`Queue::connect`](crate::Queue::connect)) or of a
/// MariaDB/MySQL URL listing several in its authority (`mysql://u@h1:3306,h2:3307/db`),
/// else `url` itself. The error says which rule the URL breaks and never quotes it.
///
/// # Examples
///
/// ```
/// let urls = icq::server_urls("postgres://app@db1:5432,db2:5433/shop").unwrap();
/// assert_eq!(urls, ["postgres://app@db1:5432/shop", "postgres://app@db2:5433/shop"]);
/// assert_eq!(icq::server_urls("sqlite:shop.db").unwrap(), ["sqlite:shop.db"]);
/// let nodes = icq::server_urls("mysql://app@g1:3306,g2:3307/shop").unwrap();
/// assert_eq!(nodes, ["mysql://app@g1:3306/shop", "mysql://app@g2:3307/shop"]);
/// ```
pub fn server_urls(url: &str) -> Result<Vec<String>, String> {
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        return Ok(mysql_hosts(url)?.into_iter().map(|host| host.url).collect());
    }
    if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
        return Ok(vec![url.to_owned()]);
    }
    Ok(postgres_hosts(url)?
        .map(|listed| listed.hosts.into_iter().map(|host| host.url).collect())
        .unwrap_or_else(|| vec![url.to_owned()]))
}

/// The servers a PostgreSQL URL names, by libpq's rules (`None` for a URL without `://`).
///
/// - In the authority, hosts are separated by commas, each with its own port or none
///   (`postgres://u@h1:5432,h2:5433,[::1]/db`).
/// - In the query, `host`, `hostaddr` and `port` may each be a comma-separated list, and
///   replace the authority's hosts and ports (`postgres://u@/db?host=h1,h2&port=5432,5433`;
///   `host=/run/postgresql` is a Unix socket directory). There are as many servers as
///   `hostaddr` values, else as `host` values; `host` and `hostaddr` given together must
///   have as many values; `port` has one value for every server or a single one for all;
///   an empty port is the default (5432).
/// - `target_session_attrs` is taken out (sqlx does not know it) and returned.
///
/// A URL naming one server, written without a comma in its hosts, `host`, `hostaddr` or
/// `port`, is passed on as written (sqlx reads its query's `host` and `port` itself). The
/// error says which rule a URL breaks and never quotes the URL (it may hold a password).
pub(crate) fn postgres_hosts(url: &str) -> Result<Option<PgHosts>, String> {
    let Some(scheme_end) = url.find("://") else {
        return Ok(None);
    };
    let (scheme, rest) = (&url[..scheme_end], &url[scheme_end + 3..]);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let hosts_start = authority.rfind('@').map_or(0, |at| at + 1);
    let (userinfo, host_list) = authority.split_at(hosts_start);
    let (path, query, fragment) = split_tail(tail);
    let mut session_attrs = None;
    let (mut q_host, mut q_port, mut q_hostaddr) = (None, None, None);
    // Every pair but `target_session_attrs`, and whether it names the server.
    let mut kept: Vec<(&str, bool)> = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = || decode_value(value);
        match decode(name).as_str() {
            "target_session_attrs" => {
                session_attrs = Some(value());
                continue;
            }
            "host" => q_host = Some(value()),
            "port" => q_port = Some(value()),
            "hostaddr" => q_hostaddr = Some(value()),
            _ => {
                kept.push((pair, false));
                continue;
            }
        }
        kept.push((pair, true));
    }
    let listed = |given: &Option<String>| given.as_ref().is_some_and(|v| v.contains(','));
    let several =
        host_list.contains(',') || listed(&q_host) || listed(&q_port) || listed(&q_hostaddr);
    if !several {
        // One server: the query's own `host`, `port` and `hostaddr` stay for sqlx.
        let query = joined_query(kept.iter().map(|(pair, _)| *pair));
        // Named as the query names it, when it does (`?host=/run/postgresql&port=6000`).
        let label = match (q_host.as_deref().or(q_hostaddr.as_deref()), &q_port) {
            (Some(host), Some(port)) => format!(
                "{}:{}",
                crate::redact::escape_for_log(host),
                crate::redact::escape_for_log(port)
            ),
            (Some(host), None) => crate::redact::escape_for_log(host),
            (None, _) => host_list.to_string(),
        };
        return Ok(Some(PgHosts {
            hosts: vec![PgHost {
                label,
                url: format!("{scheme}://{authority}{path}{query}{fragment}"),
            }],
            session_attrs,
        }));
    }
    // The authority's hosts and ports (libpq reads `h1:5432,h2` as hosts `h1,h2`, ports
    // `5432,`), replaced by the query's lists where it gives them.
    let written: Vec<(String, String)> = if host_list.is_empty() {
        Vec::new()
    } else {
        host_list.split(',').map(host_and_port).collect()
    };
    let hosts: Option<Vec<String>> = match &q_host {
        Some(value) => Some(value.split(',').map(str::to_string).collect()),
        None if !written.is_empty() => Some(written.iter().map(|(h, _)| h.clone()).collect()),
        None => None,
    };
    let ports: Option<Vec<String>> = match &q_port {
        Some(value) => Some(value.split(',').map(str::to_string).collect()),
        None if written.iter().any(|(_, p)| !p.is_empty()) => {
            Some(written.iter().map(|(_, p)| p.clone()).collect())
        }
        None => None,
    };
    let addrs: Option<Vec<String>> = q_hostaddr
        .as_ref()
        .map(|value| value.split(',').map(str::to_string).collect());
    let n = match (&addrs, &hosts) {
        (Some(addrs), _) => addrs.len(),
        (None, Some(hosts)) => hosts.len(),
        (None, None) => 1,
    };
    if let (Some(hosts), Some(addrs)) = (&hosts, &addrs)
        && hosts.len() != addrs.len()
    {
        return Err(format!(
            "{} host names for {} `hostaddr` values: libpq's rule is one `hostaddr` for every \
             host (or no `host` at all)",
            hosts.len(),
            addrs.len()
        ));
    }
    if let Some(ports) = &ports
        && ports.len() != 1
        && ports.len() != n
    {
        return Err(format!(
            "{} port numbers for {n} host{}: libpq's rule is one port for every host, or a \
             single port for all of them",
            ports.len(),
            if n == 1 { "" } else { "s" }
        ));
    }
    let shared = Shared {
        scheme,
        userinfo,
        path,
        query: joined_query(
            kept.iter()
                .filter(|(_, server)| !server)
                .map(|(pair, _)| *pair),
        ),
        fragment,
    };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let host = hosts.as_ref().map_or("", |hosts| hosts[i].as_str());
        let addr = addrs.as_ref().map_or("", |addrs| addrs[i].as_str());
        let port = ports.as_ref().map_or("", |ports| {
            ports[if ports.len() == 1 { 0 } else { i }].as_str()
        });
        if host.is_empty() && addr.is_empty() {
            return Err(
                "an empty host in the host list (write `h1:5432,h2:5433`, or \
                 `?host=h1,h2&port=5432,5433`)"
                    .to_string(),
            );
        }
        out.push(one_server(&shared, host, addr, port));
    }
    Ok(Some(PgHosts {
        hosts: out,
        session_attrs,
    }))
}

/// What every server of a host list shares: the URL around its hosts.
struct Shared<'a> {
    scheme: &'a str,
    /// `user:password@`, or nothing.
    userinfo: &'a str,
    path: &'a str,
    /// `?…` without the server's parameters, or nothing.
    query: String,
    fragment: &'a str,
}

/// The URL for one server of a host list, and its label. `host` may be empty (then
/// `addr` is not) or a Unix socket directory; `addr` and `port` may be empty.
fn one_server(shared: &Shared<'_>, host: &str, addr: &str, port: &str) -> PgHost {
    let bracketed = |h: &str| {
        if h.contains(':') && !h.starts_with('[') {
            format!("[{h}]")
        } else {
            h.to_string()
        }
    };
    let socket = host.starts_with('/');
    let name = if socket {
        host.to_string()
    } else {
        bracketed(if host.is_empty() { addr } else { host })
    };
    // A socket directory and its port go in the query (sqlx reads `host=/dir` as a
    // socket); the authority then needs a host of some kind.
    let mut extra: Vec<String> = Vec::new();
    let authority = if socket {
        extra.push(format!("host={}", encode(host)));
        if !port.is_empty() {
            extra.push(format!("port={}", encode(port)));
        }
        "localhost".to_string()
    } else if port.is_empty() {
        name.clone()
    } else {
        format!("{name}:{port}")
    };
    if !addr.is_empty() {
        extra.push(format!("hostaddr={}", encode(addr)));
    }
    let mut label = crate::redact::escape_for_log(&name);
    if !host.is_empty() && !addr.is_empty() {
        label.push_str(&format!(
            " (hostaddr {})",
            crate::redact::escape_for_log(addr)
        ));
    }
    if !port.is_empty() {
        label.push_str(&format!(":{}", crate::redact::escape_for_log(port)));
    }
    let Shared {
        scheme,
        userinfo,
        path,
        query,
        fragment,
    } = shared;
    let query = match (query.is_empty(), extra.is_empty()) {
        (_, true) => query.clone(),
        (true, false) => format!("?{}", extra.join("&")),
        (false, false) => format!("{query}&{}", extra.join("&")),
    };
    PgHost {
        label,
        url: format!("{scheme}://{userinfo}{authority}{path}{query}{fragment}"),
    }
}

/// `h:5432` as host and port, `[::1]:5432` as `[::1]` and port, `h` with no port.
fn host_and_port(entry: &str) -> (String, String) {
    let port_sep = match entry.rfind(']') {
        Some(close) => entry[close..].find(':').map(|i| close + i),
        None => entry.rfind(':'),
    };
    match port_sep {
        Some(colon) => (entry[..colon].to_string(), entry[colon + 1..].to_string()),
        None => (entry.to_string(), String::new()),
    }
}

/// A URL's path, query (without `?`) and fragment (with `#`).
fn split_tail(tail: &str) -> (&str, &str, &str) {
    let (head, fragment) = match tail.find('#') {
        Some(hash) => tail.split_at(hash),
        None => (tail, ""),
    };
    match head.split_once('?') {
        Some((path, query)) => (path, query, fragment),
        None => (head, "", fragment),
    }
}

/// `?a&b` from the pairs, or nothing when there are none.
fn joined_query<'a>(pairs: impl Iterator<Item = &'a str>) -> String {
    let pairs: Vec<&str> = pairs.collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

/// A query value as sqlx's URL parser reads it (form decoding: `+` is a blank).
fn decode_value(text: &str) -> String {
    url::form_urlencoded::parse(format!("v={text}").as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

/// A query value encoded for [`decode_value`].
fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A secret-looking parameter name sqlx's PostgreSQL driver would log with its value.
fn is_unknown_secret(name: &str) -> bool {
    !SQLX_POSTGRES_PARAMETERS.contains(&name)
        && !name.starts_with("options[")
        && crate::redact::is_secret_name(name)
}

/// A query name as a form decoder reads it (`+` is a blank, `%XX` a byte), lossily.
fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("{text}=").as_bytes())
        .next()
        .map(|(name, _)| name.into_owned())
        .unwrap_or_default()
}

/// One server of a MariaDB/MySQL URL's host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MySqlHost {
    /// `host:port` as written, never a secret.
    pub(crate) label: String,
    /// The URL with only this server: scheme, user information, database and query as
    /// written.
    pub(crate) url: String,
}

/// The servers a MariaDB/MySQL URL names, in its order: the hosts of its authority,
/// separated by commas, each with its own port or none (`mysql://u:p@h1:3306,h2:3307,
/// [::1]:3308/db`; sqlx takes one host, so each gets a URL of its own). A URL naming one
/// host is returned as written. The error says which rule the URL breaks and never quotes
/// the URL (it may hold a password).
pub(crate) fn mysql_hosts(url: &str) -> Result<Vec<MySqlHost>, String> {
    let Some(scheme_end) = url.find("://") else {
        return Ok(vec![MySqlHost {
            label: String::new(),
            url: url.to_owned(),
        }]);
    };
    let (scheme, rest) = (&url[..scheme_end], &url[scheme_end + 3..]);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let hosts_start = authority.rfind('@').map_or(0, |at| at + 1);
    let (userinfo, host_list) = authority.split_at(hosts_start);
    if !host_list.contains(',') {
        return Ok(vec![MySqlHost {
            label: crate::redact::escape_for_log(host_list),
            url: url.to_owned(),
        }]);
    }
    let (_, query, _) = split_tail(tail);
    let chooses_its_own = query.split('&').any(|pair| {
        let name = decode(pair.split_once('=').map_or(pair, |(name, _)| name));
        matches!(name.as_str(), "socket" | "host" | "port")
    });
    if chooses_its_own {
        return Err(
            "a URL listing several hosts cannot also name a `socket`, `host` or `port` \
             parameter: give each host its port in the list (`h1:3306,h2:3307`)"
                .to_string(),
        );
    }
    let mut hosts = Vec::new();
    for (i, entry) in host_list.split(',').enumerate() {
        let (host, port) = host_and_port(entry);
        if host.is_empty() {
            return Err(format!("host {} of the URL's host list is empty", i + 1));
        }
        if !port.is_empty() && port.parse::<u16>().is_err() {
            return Err(format!(
                "the port of host {} of the URL's host list is not a number from 0 to 65535",
                i + 1
            ));
        }
        hosts.push(MySqlHost {
            label: crate::redact::escape_for_log(entry),
            url: format!("{scheme}://{userinfo}{entry}{tail}"),
        });
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_parameters_sqlx_would_log_are_removed() {
        for (given, wanted) in [
            (
                "postgres://u@h/d?PassWord=S1&sslpassword=S2&application_name=a",
                "postgres://u@h/d?application_name=a",
            ),
            ("postgresql://u@h/d?PASSWORD=S1", "postgresql://u@h/d"),
            (
                "postgres://u@h/d?pass%57ord=S1&x=1#frag",
                "postgres://u@h/d?x=1#frag",
            ),
            (
                "postgres://u:p@h1:5432,h2:5433/d?target_session_attrs=read-write&api_token=S3",
                "postgres://u:p@h1:5432,h2:5433/d?target_session_attrs=read-write",
            ),
            ("postgres://u@h/d?api+token=S4", "postgres://u@h/d"),
        ] {
            assert_eq!(for_driver(given), wanted, "{given}");
        }
        // Kept as written: what sqlx takes, what is not secret, other engines.
        for kept in [
            "postgres://u@h/d?password=S&options=-c%20password%3DS&options[search_path]=x",
            "postgres://u@h/d?sslmode=disable&application_name=icq&unknown=1",
            "postgres://u@h/d",
            "mysql://u@h/d?PassWord=S",
            "sqlite:q.db?mode=rwc&key=S",
        ] {
            assert!(matches!(for_driver(kept), Cow::Borrowed(_)), "{kept}");
        }
    }

    /// The labels and URLs of a host list.
    fn listed(url: &str) -> (Vec<String>, Vec<String>, Option<String>) {
        let hosts = postgres_hosts(url).unwrap().unwrap();
        (
            hosts.hosts.iter().map(|h| h.label.clone()).collect(),
            hosts.hosts.iter().map(|h| h.url.clone()).collect(),
            hosts.session_attrs,
        )
    }

    #[test]
    fn hosts_in_the_authority_are_cut_into_one_url_each() {
        let (labels, urls, attrs) = listed(
            "postgres://u:p@h1:5432,h2:5433,[::1]/d?target_session_attrs=read-write&sslmode=disable#f",
        );
        assert_eq!(labels, ["h1:5432", "h2:5433", "[::1]"]);
        assert_eq!(
            urls,
            [
                "postgres://u:p@h1:5432/d?sslmode=disable#f",
                "postgres://u:p@h2:5433/d?sslmode=disable#f",
                "postgres://u:p@[::1]/d?sslmode=disable#f",
            ]
        );
        assert_eq!(attrs.as_deref(), Some("read-write"));
        // One host: as written, `target_session_attrs` alone taken out.
        let (labels, urls, attrs) =
            listed("postgres://u@h/d?a=1&target_session_attrs=any&host=/tmp&port=6000");
        assert_eq!(labels, ["/tmp:6000"]);
        assert_eq!(urls, ["postgres://u@h/d?a=1&host=/tmp&port=6000"]);
        assert_eq!(attrs.as_deref(), Some("any"));
        assert_eq!(postgres_hosts("sqlite:q.db").unwrap(), None);
    }

    #[test]
    fn hosts_in_the_query_follow_libpqs_rules() {
        // One port for every host.
        let (labels, urls, attrs) = listed(
            "postgres://u:p@/d?host=h1,h2&port=5432,5433&target_session_attrs=read-write&application_name=a",
        );
        assert_eq!(labels, ["h1:5432", "h2:5433"]);
        assert_eq!(
            urls,
            [
                "postgres://u:p@h1:5432/d?application_name=a",
                "postgres://u:p@h2:5433/d?application_name=a",
            ]
        );
        assert_eq!(attrs.as_deref(), Some("read-write"));
        // A single port for all; the query's hosts replace the authority's.
        let (labels, _, _) = listed("postgres://ignored:6000/d?host=h1,h2");
        assert_eq!(labels, ["h1:6000", "h2:6000"]);
        let (labels, _, _) = listed("postgresql:///d?host=h1,%5B::1%5D,::2&port=7000");
        assert_eq!(labels, ["h1:7000", "[::1]:7000", "[::2]:7000"]);
        // An empty port is the default.
        let (labels, urls, _) = listed("postgres:///d?host=h1,h2&port=,5433");
        assert_eq!(labels, ["h1", "h2:5433"]);
        assert_eq!(urls[0], "postgres://h1/d");
        // A Unix socket directory, and `hostaddr` (the address to connect to; the name
        // stays for TLS).
        let (labels, urls, _) =
            listed("postgres://u@/d?host=/run/postgresql,db.example&hostaddr=,10.0.0.2&port=5432");
        assert_eq!(
            labels,
            [
                "/run/postgresql:5432",
                "db.example (hostaddr 10.0.0.2):5432"
            ]
        );
        assert_eq!(
            urls,
            [
                "postgres://u@localhost/d?host=%2Frun%2Fpostgresql&port=5432",
                "postgres://u@db.example:5432/d?hostaddr=10.0.0.2",
            ]
        );
        let (labels, urls, _) = listed("postgres:///d?hostaddr=10.0.0.1,10.0.0.2");
        assert_eq!(labels, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(urls[1], "postgres://10.0.0.2/d?hostaddr=10.0.0.2");
    }

    #[test]
    fn host_lists_that_break_libpqs_rules_are_refused_naming_the_rule() {
        for (url, wanted) in [
            (
                "postgres://u:s3cret@/d?host=h1,h2&port=1,2,3&password=s3cret",
                "3 port numbers for 2 hosts: libpq's rule is one port for every host, or a single port for all of them",
            ),
            (
                "postgres:///d?host=h&port=5432,5433",
                "2 port numbers for 1 host: libpq's rule",
            ),
            (
                "postgres:///d?host=h1,h2&hostaddr=10.0.0.1",
                "2 host names for 1 `hostaddr` values: libpq's rule is one `hostaddr` for every host",
            ),
            ("postgres://u@h1,,h2/d", "an empty host in the host list"),
            (
                "postgres:///d?host=h1,,h2",
                "an empty host in the host list",
            ),
        ] {
            let err = postgres_hosts(url).unwrap_err();
            assert!(err.contains(wanted), "{url}: {err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn secrets_stay_out_of_host_lists_in_the_query() {
        // What sqlx would log is dropped before the list is cut; the password sqlx takes
        // goes to every host's URL, never to a label.
        let url = "postgres://u:pw@/d?host=h1,h2&port=1,2&PassWord=S1&password=S2";
        let driver = for_driver(url);
        assert_eq!(driver, "postgres://u:pw@/d?host=h1,h2&port=1,2&password=S2");
        let hosts = postgres_hosts(&driver).unwrap().unwrap();
        for host in &hosts.hosts {
            assert!(!host.label.contains("pw") && !host.label.contains("S2"));
            assert!(host.url.ends_with("/d?password=S2"), "{}", host.url);
        }
        // A driver's message quoting the password is masked too.
        let said = crate::redact::redact_in("login failed: pw, S1, S2", url);
        assert!(
            !said.contains("pw") && !said.contains("S1") && !said.contains("S2"),
            "{said}"
        );
        let shown = crate::redact::redact_url(url);
        assert!(
            !shown.contains("pw@") && !shown.contains("S1") && !shown.contains("S2"),
            "{shown}"
        );
    }

    #[test]
    fn mysql_hosts_in_the_authority_are_cut_into_one_url_each() {
        let hosts =
            mysql_hosts("mysql://app:s3cret@g1:3306,g2:3307,[::1]:3308/shop?ssl-mode=disabled")
                .unwrap();
        let urls: Vec<&str> = hosts.iter().map(|h| h.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "mysql://app:s3cret@g1:3306/shop?ssl-mode=disabled",
                "mysql://app:s3cret@g2:3307/shop?ssl-mode=disabled",
                "mysql://app:s3cret@[::1]:3308/shop?ssl-mode=disabled",
            ]
        );
        let labels: Vec<&str> = hosts.iter().map(|h| h.label.as_str()).collect();
        assert_eq!(labels, ["g1:3306", "g2:3307", "[::1]:3308"]);
        assert!(labels.iter().all(|l| !l.contains("s3cret")));
        // Without user information or a port, and with the `mariadb` scheme.
        let hosts = mysql_hosts("mariadb://g1,g2:3307").unwrap();
        assert_eq!(hosts[0].url, "mariadb://g1");
        assert_eq!(hosts[1].url, "mariadb://g2:3307");
        // One host: as written.
        let one = "mysql://app:p@db:3306/shop?x=1";
        assert_eq!(mysql_hosts(one).unwrap()[0].url, one);
        assert_eq!(
            server_urls("mysql://u@a:1,b:2/d").unwrap(),
            ["mysql://u@a:1/d", "mysql://u@b:2/d"]
        );
    }

    #[test]
    fn mysql_host_lists_that_cannot_work_are_refused_without_quoting_the_url() {
        for (url, rule) in [
            ("mysql://u:s3cret@g1,,g3/db", "host 2"),
            ("mysql://u:s3cret@g1:3306,g2:port/db", "port of host 2"),
            (
                "mysql://u:s3cret@g1,g2/db?socket=/run/mysqld.sock",
                "socket",
            ),
        ] {
            let err = mysql_hosts(url).unwrap_err();
            assert!(err.contains(rule), "{url}: {err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }
}
