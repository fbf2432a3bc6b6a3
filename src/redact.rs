//! Keeping secrets out of output, and keeping foreign text from forging log lines.
//!
//! - [`redact_url`] renders one URL (a database URL, an http handler's endpoint) with the
//!   password of its user information and the value of every secret-looking query
//!   parameter (`password`, `token`, `api_key`, ... see [`is_secret_name`]) replaced by
//!   `***`.
//! - [`redact_text`] does the same to every URL, and to every `name=value` pair with a
//!   secret-looking name, found anywhere inside a longer text (a driver's error message,
//!   a serde error echoing a value).
//! - [`redact_in`] additionally masks every occurrence of one known URL's secrets inside a
//!   text, wherever they appear.
//! - [`escape_for_log`] makes text from a handler (stderr, a response body) safe to put on
//!   one log line, and [`echo`] / [`number_text`] bound what a message repeats of a value
//!   the user typed; [`clean_stored_text`] makes it safe to store in `LastError` and show on
//!   a terminal while keeping its line breaks.

use std::fmt::Write as _;

/// What every masked secret is replaced with.
pub const MASK: &str = "***";

/// Query-parameter (and `name=value`) names whose values are secrets, compared
/// case-insensitively with `-` read as `_`.
const SECRET_NAMES: &[&str] = &[
    "password",
    "passwd",
    "pass",
    "pwd",
    "sslpassword",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "api_token",
    "apitoken",
    "private_token",
    "api_key",
    "apikey",
    "key",
    "access_key",
    "secret_key",
    "client_secret",
    "secret",
    "sig",
    "signature",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "session",
    "sessionid",
    "session_id",
    "jwt",
    "bearer",
    "x_api_key",
    "x_amz_signature",
    "x_amz_security_token",
    "x_amz_credential",
];

/// True when a query parameter (or `name=value` pair) called `name` carries a secret:
/// one of the well-known names, or any name containing `password`, `passwd`, `secret`
/// or `token`.
pub fn is_secret_name(name: &str) -> bool {
    let normalized: String = name
        .trim()
        .chars()
        .map(|c| match c {
            '-' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    if normalized.is_empty() {
        return false;
    }
    SECRET_NAMES.contains(&normalized.as_str())
        || ["password", "passwd", "secret", "token"]
            .iter()
            .any(|part| normalized.contains(part))
}

/// Renders a URL for messages and logs with any password and every secret-looking query
/// parameter value replaced by `***`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some(MASK));
            }
            if let Some(query) = parsed.query().map(str::to_owned) {
                parsed.set_query(Some(&redact_query(&query)));
            }
            // OAuth-style fragments (`#access_token=...`) carry secrets too.
            if let Some(fragment) = parsed.fragment().map(str::to_owned) {
                parsed.set_fragment(Some(&redact_query(&fragment)));
            }
            parsed.to_string()
        }
        // Unparseable: mask what looks like user information and secret parameters.
        Err(_) => {
            let masked = redact_text(url);
            if masked.contains("://") {
                masked
            } else {
                // No scheme separator: a bare `user:password@host` is possible.
                match masked.rsplit_once('@') {
                    Some((_, host)) => format!("{MASK}@{host}"),
                    None => masked,
                }
            }
        }
    }
}

/// The query string `query` (without `?`) with each secret-looking parameter's value
/// replaced by `***`; every other byte is kept as written.
fn redact_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    for (index, pair) in query.split('&').enumerate() {
        if index > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, _)) if is_secret_name(&percent_decode(name)) => {
                out.push_str(name);
                out.push('=');
                out.push_str(MASK);
            }
            Some((name, value)) => match redact_nested(value) {
                Some(masked) => {
                    out.push_str(name);
                    out.push('=');
                    out.push_str(&masked);
                }
                None => out.push_str(pair),
            },
            None => out.push_str(pair),
        }
    }
    out
}

/// A query value that holds secrets of its own, masked and re-encoded: libpq's
/// `options=-c%20password%3Ds3cret` (`-c password=s3cret` once decoded), or a URL with a
/// password passed as a parameter. `None` when the decoded value holds no secret.
fn redact_nested(value: &str) -> Option<String> {
    let decoded = percent_decode(&value.replace('+', " "));
    let masked = redact_text(&decoded);
    (masked != decoded).then(|| encode_query_value(&masked))
}

/// Percent-encodes what a query value cannot hold as is (blanks, `&`, `=`, `#`, `%`,
/// `+`, controls, non-ASCII); the mask's `*` stays readable.
fn encode_query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~*!$'(),;:@/?[]".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// True when a key found in free text names a secret: as a whole, or its last bracketed
/// part (`options[password]`, `[key`).
fn is_secret_key(name: &str) -> bool {
    let last = name
        .rsplit('[')
        .next()
        .unwrap_or(name)
        .trim_end_matches(']');
    is_secret_name(name) || is_secret_name(last)
}

/// Masks the value of every `name%3Dvalue` (an `=` percent-encoded inside a query value,
/// as in `options=-c%20password%3Ds3cret`) whose name is secret-looking. The name starts
/// after a non-name character or a `%XX` escape (`-c%20password`); the value runs as in
/// [`mask_name_values`].
fn mask_encoded_name_values(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    if !lower.contains("%3d") {
        return text.to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    let mut search = 0;
    while let Some(found) = lower[search..].find("%3d") {
        let eq = search + found;
        let mut name_start = eq;
        while name_start > 0 {
            let c = bytes[name_start - 1];
            let escape_ends_here = name_start >= 3
                && bytes[name_start - 3] == b'%'
                && bytes[name_start - 2].is_ascii_hexdigit()
                && c.is_ascii_hexdigit();
            if escape_ends_here || !(c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.')) {
                break;
            }
            name_start -= 1;
        }
        let name = &text[name_start..eq];
        let after = eq + 3;
        search = after;
        if !is_secret_name(name) {
            continue;
        }
        let end = text[after..]
            .find(|c: char| c.is_whitespace() || matches!(c, '&' | '#'))
            .map_or(text.len(), |i| after + i);
        let (value, punctuation) = split_trailing(&text[after..end]);
        out.push_str(&text[done..after]);
        if value.is_empty() || value.starts_with(MASK) {
            out.push_str(value);
        } else {
            out.push_str(MASK);
        }
        out.push_str(punctuation);
        done = end;
        search = end;
    }
    out.push_str(&text[done..]);
    out
}

/// Decodes `%XX` escapes, lossily (`+` is kept: in user information it is literal).
fn percent_decode(text: &str) -> String {
    decode_escapes(text, false)
}

/// Decodes `%XX` escapes; with `printable_only`, only those of printable ASCII
/// characters (the others stay as written), which is how a person may have typed the
/// secret before the URL parser escaped its punctuation.
fn decode_escapes(text: &str, printable_only: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low))
                if !printable_only || (0x20..0x7f).contains(&(high * 16 + low)) =>
            {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Punctuation that, at the end of a masked stretch, is more likely the text's own (the
/// closing quote around a URL, a comma or colon after it) than part of the secret: kept
/// after the mask.
fn trailing_punctuation(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '`' | ',' | '.' | ':' | ';' | ')' | ']' | '}' | '>'
    )
}

/// `stretch` split into what is masked and the trailing punctuation kept after the mask.
fn split_trailing(stretch: &str) -> (&str, &str) {
    let kept = stretch.trim_end_matches(trailing_punctuation);
    stretch.split_at(kept.len())
}

/// Every mask of [`redact_text`] starts at a `://`, a `=` or a `%3D`: text with none is
/// kept as is (most log fields: ids, type names, counts), without its three passes.
fn nothing_to_mask(text: &str) -> bool {
    !text.contains("://") && !text.contains(['=', '%'])
}

/// Masks secrets anywhere in `text`: the password of every `scheme://user:password@host`,
/// and the value of every `name=value` pair whose name `is_secret_name` (query
/// parameters, but also libpq-style `password=...` settings). Everything else is kept.
pub fn redact_text(text: &str) -> String {
    if nothing_to_mask(text) {
        return text.to_owned();
    }
    mask_encoded_name_values(&mask_name_values(&mask_userinfo(text)))
}

/// Masks the password of every `scheme://user:password@host` in `text`.
///
/// Conservative on purpose: the user information is taken to run to the last `@` before
/// the next blank, so a password holding an unescaped `/`, `#` or quote is still masked.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("://") {
        let (head, tail) = rest.split_at(start + 3);
        out.push_str(head);
        let end = tail.find(char::is_whitespace).unwrap_or(tail.len());
        let region = &tail[..end];
        let userinfo = region.rfind('@').map(|at| (&region[..at], &region[at..]));
        match userinfo.and_then(|(info, host)| info.find(':').map(|colon| (info, colon, host))) {
            Some((info, colon, host)) => {
                out.push_str(&info[..=colon]);
                out.push_str(MASK);
                out.push_str(host);
            }
            None => out.push_str(region),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Masks the value of every `name=value` whose name is secret-looking. A name starts
/// after a non-name character (`?`, `&`, `;`, a blank, ...); a value runs to the next `&`,
/// `#` or blank (masking too much rather than too little), except for closing
/// punctuation at its very end (see [`trailing_punctuation`]).
fn mask_name_values(text: &str) -> String {
    // `[`, `]` and `%` too: `options[password]=` and `options%5Bpassword%5D=` are names.
    let is_name_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '[' | ']' | '%');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let (before, after) = (&rest[..eq], &rest[eq + 1..]);
        let name_start = before
            .char_indices()
            .rev()
            .find(|&(_, c)| !is_name_char(c))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let name = &before[name_start..];
        out.push_str(before);
        out.push('=');
        if is_secret_key(&percent_decode(name)) && !after.starts_with('=') {
            let end = after
                .find(|c: char| c.is_whitespace() || matches!(c, '&' | '#'))
                .unwrap_or(after.len());
            let (value, punctuation) = split_trailing(&after[..end]);
            // Empty, or masked already (a redacted URL inside a message): kept as is.
            if value.is_empty() || value.starts_with(MASK) {
                out.push_str(value);
            } else {
                out.push_str(MASK);
            }
            out.push_str(punctuation);
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The secrets a URL holds: its password and the values of its secret-looking query
/// parameters, both as written and percent-decoded.
fn secrets_of(url: &str) -> Vec<String> {
    let Ok(parsed) = url::Url::parse(url).or_else(|_| url::Url::parse(&first_host_only(url)))
    else {
        return Vec::new();
    };
    let mut secrets = Vec::new();
    if let Some(password) = parsed.password() {
        secrets.push(password.to_string());
        secrets.push(percent_decode(password));
        secrets.push(decode_escapes(password, true));
    }
    if let Some(query) = parsed.query() {
        for pair in query.split('&') {
            if let Some((name, value)) = pair.split_once('=')
                && is_secret_name(&percent_decode(name))
            {
                secrets.push(value.to_string());
                secrets.push(percent_decode(value));
                secrets.push(decode_escapes(value, true));
                // As a form-encoded query decoder (sqlx's) reads it.
                secrets.push(percent_decode(&value.replace('+', " ")));
            }
        }
    }
    secrets.retain(|s| !s.is_empty() && s != MASK);
    // Longest first, so a secret containing another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

/// A libpq multi-host URL (`postgres://u:p@h1:5432,h2:5433/db`) with its host list cut
/// to the first host, or one with no host (`postgres://u:p@/db?host=h1,h2`, libpq's query
/// form) given `localhost`, so the URL parser reads its user information and query (the
/// secrets are the same for every host). Any other text is returned unchanged.
fn first_host_only(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let hosts_start = authority.rfind('@').map_or(0, |at| at + 1);
    let hosts = &authority[hosts_start..];
    let first = match hosts.split(',').next() {
        Some("") | None => "localhost",
        Some(first) => first,
    };
    if first == hosts {
        return url.to_string();
    }
    format!(
        "{}{first}{}",
        &url[..start + hosts_start],
        &rest[authority_end..]
    )
}

/// Masks, inside `text` (e.g. a driver's message), every occurrence of the secrets that
/// `url` holds (its password, its secret query values), then every URL and secret
/// `name=value` pair as [`redact_text`] does.
pub fn redact_in(text: &str, url: &str) -> String {
    let mut masked = text.to_string();
    for secret in secrets_of(url) {
        masked = masked.replace(&secret, MASK);
    }
    redact_text(&masked)
}

/// Makes foreign text (a handler's stderr, a response body) safe for one log line:
/// line breaks, tabs and every other control character (C0, DEL, C1), and the Unicode
/// line/paragraph separators and bidirectional overrides, are written as escapes (`\n`,
/// `\r`, `\t`, `\u{1b}`, ...), so the text can never start a forged log line or
/// restyle a terminal. Everything else, backslashes included, is kept as is.
pub fn escape_for_log(text: &str) -> String {
    escape(text, false)
}

/// `text` cut to at most `max` bytes on a character boundary, saying how much was cut.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let note = format!(" … [cut: {} bytes in all]", text.len());
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &text[..end])
}

/// A value the user typed, as an error message echoes it: escaped like
/// [`escape_for_log`] and cut to its first 40 characters (with `…`), so a 300-digit
/// number or a pasted document cannot bury the message.
pub fn echo(text: &str) -> String {
    const SHOWN: usize = 40;
    match text.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", escape_for_log(&text[..end])),
        None => escape_for_log(text),
    }
}

/// A number as a message shows it: as written for everyday sizes, in scientific notation
/// beyond (`1e300`, not 301 digits).
pub fn number_text(value: f64) -> String {
    if value.is_finite() && (value == 0.0 || (1e-6..1e15).contains(&value.abs())) {
        value.to_string()
    } else {
        format!("{value:e}")
    }
}

/// Makes foreign text safe to store in `LastError` and show on a terminal, keeping it
/// readable: line breaks (`\n`) and tabs stay, a `\r\n` becomes `\n`, and every other
/// control or bidirectional-override character is escaped as [`escape_for_log`] does.
#[cfg_attr(
    not(any(feature = "http", all(unix, feature = "exec"))),
    allow(dead_code)
)]
pub fn clean_stored_text(text: &str) -> String {
    escape(&text.replace("\r\n", "\n"), true)
}

/// A control or bidirectional-override character: escaped in log lines and stored text.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `text` goes into a log line unchanged: nothing [`redact_text`] would mask and
/// nothing [`escape_for_log`] would escape (a log field's usual case: ids, type names,
/// counts), so the line's formatter can skip both.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub fn is_plain_for_log(text: &str) -> bool {
    nothing_to_mask(text) && !text.chars().any(unsafe_char)
}

fn escape(text: &str, keep_lines: bool) -> String {
    if !text.chars().any(unsafe_char) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' | '\t' if keep_lines => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_and_numbers_are_bounded() {
        assert_eq!(echo("high"), "high");
        assert_eq!(echo(&"9".repeat(300)).chars().count(), 41);
        assert_eq!(echo("a\nb"), "a\\nb");
        assert_eq!(number_text(2.5), "2.5");
        assert_eq!(number_text(10.0), "10");
        assert_eq!(number_text(1e300), "1e300");
        assert_eq!(number_text(-1.0), "-1");
    }

    /// The log formatter's fast path skips masking and escaping only where neither
    /// would change anything.
    #[test]
    fn plain_log_text_is_what_masking_and_escaping_leave_alone() {
        for plain in [
            "9f1c2d3e-0000-4000-8000-000000000000",
            "orders.send_receipt",
            "3",
            "a b",
        ] {
            assert!(is_plain_for_log(plain), "{plain}");
            assert_eq!(escape_for_log(&redact_text(plain)), plain);
        }
        for not_plain in [
            "password=x",
            "p%3Dx",
            "postgres://u:p@h/db",
            "a\nb",
            "a\u{202e}b",
        ] {
            assert!(!is_plain_for_log(not_plain), "{not_plain:?}");
        }
        assert_eq!(redact_text("token=abc"), format!("token={MASK}"));
    }

    #[test]
    fn masks_passwords() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/orders"),
            "postgres://app:***@db:5432/orders"
        );
        assert_eq!(redact_url("sqlite:orders.db"), "sqlite:orders.db");
        assert!(!redact_in("auth failed for s3cret", "mysql://u:s3cret@h/d").contains("s3cret"));
    }

    #[test]
    fn masks_secret_query_parameters_in_urls() {
        assert_eq!(
            redact_url("postgres://u@h/db?password=X1&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://u:A@h/db?PassWord=B&sslpassword=C&application_name=app"),
            "postgres://u:***@h/db?PassWord=***&sslpassword=***&application_name=app"
        );
        assert_eq!(
            redact_url("https://hooks.example/x?token=t0k&api-key=k&Access_Token=a&n=1"),
            "https://hooks.example/x?token=***&api-key=***&Access_Token=***&n=1"
        );
        // A percent-encoded name is still recognised.
        assert_eq!(
            redact_url("https://h/x?pass%77ord=s"),
            "https://h/x?pass%77ord=***"
        );
        // Not secrets: kept.
        assert_eq!(
            redact_url("mysql://root@h/d?ssl-mode=disabled&charset=utf8mb4"),
            "mysql://root@h/d?ssl-mode=disabled&charset=utf8mb4"
        );
        assert_eq!(
            redact_url("sqlite:app.db?mode=rwc&key=abc"),
            "sqlite:app.db?mode=rwc&key=***"
        );
    }

    #[test]
    fn multi_host_urls_are_masked_in_every_form() {
        let url =
            "postgres://app:s3cret@h1:5432,h2:5433/db?target_session_attrs=read-write&password=p2";
        let shown = redact_url(url);
        assert_eq!(
            shown,
            "postgres://app:***@h1:5432,h2:5433/db?target_session_attrs=read-write&password=***"
        );
        let text = "password authentication failed: s3cret / p2 rejected by h2:5433";
        let masked = redact_in(text, url);
        assert!(
            !masked.contains("s3cret") && !masked.contains("p2 "),
            "{masked}"
        );
        assert_eq!(
            first_host_only("postgres://u:p@[::1]:5432,h2/db"),
            "postgres://u:p@[::1]:5432/db"
        );
        assert_eq!(first_host_only("postgres://h1,h2"), "postgres://h1");
    }

    #[test]
    fn mysql_multi_host_urls_are_masked_in_every_form() {
        for url in [
            "mysql://app:s3cret@g1:3306,g2:3307,g3:3308/db?ssl-mode=disabled&password=p2",
            "mariadb://app:s3cret@g1,g2/db?password=p2",
            "mysql://app:s3cret@[::1]:3306,[::2]:3307/db?password=p2",
        ] {
            let shown = redact_url(url);
            assert!(
                !shown.contains("s3cret") && !shown.contains("p2"),
                "{url}: {shown}"
            );
            assert!(shown.contains(":***@"), "{shown}");
            let text = format!("error connecting: s3cret / p2 rejected; url {url}");
            let masked = redact_in(&text, url);
            assert!(
                !masked.contains("s3cret") && !masked.contains("p2"),
                "{masked}"
            );
            assert!(
                !redact_text(url).contains("s3cret") && !redact_text(url).contains("=p2"),
                "{}",
                redact_text(url)
            );
        }
        assert_eq!(
            redact_url("mysql://app:s3cret@g1:3306,g2:3307/db"),
            "mysql://app:***@g1:3306,g2:3307/db"
        );
    }

    #[test]
    fn unparseable_urls_are_masked_too() {
        let shown = redact_url("postgres://u:p@ss@[bad/db?password=X");
        assert!(!shown.contains("p@ss") && !shown.contains("=X"), "{shown}");
    }

    #[test]
    fn secrets_inside_free_text_are_masked() {
        assert_eq!(
            redact_text("cannot connect to \"postgres://u:pw@h/db?token=t&x=1\": refused"),
            "cannot connect to \"postgres://u:***@h/db?token=***&x=1\": refused"
        );
        assert_eq!(
            redact_text("host=h user=u password=hunter2 dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(redact_text("a == b, key= , x=1"), "a == b, key= , x=1");
        assert_eq!(redact_text("no secrets here"), "no secrets here");
        // Masked already: left alone, punctuation included.
        assert_eq!(
            redact_text("connecting to postgres://u:***@h/d?password=***: timed out"),
            "connecting to postgres://u:***@h/d?password=***: timed out"
        );
    }

    #[test]
    fn redact_in_masks_the_urls_secrets_wherever_they_appear() {
        let url = "postgres://u:Pw%21@h/db?password=Q%20R&sslpassword=S";
        let text = "failed: Pw! / Pw%21 / Q R / Q%20R / S";
        assert!(!redact_in("said x/%aa", "postgres://u:x%2F%aa@h/d").contains("x/%aa"));
        assert!(!redact_in("said y%00]", "postgres://u:y%00%5D@h/d").contains("y%00"));
        let masked = redact_in(text, url);
        for secret in ["Pw!", "Pw%21", "Q R", "Q%20R", "/ S"] {
            assert!(!masked.contains(secret), "{secret} in {masked}");
        }
    }

    #[test]
    fn secret_names() {
        for name in [
            "password",
            "PASSWORD",
            "passwd",
            "pwd",
            "token",
            "access_token",
            "api_key",
            "apikey",
            "API-KEY",
            "key",
            "secret",
            "sslpassword",
            "auth",
            "db_password",
            "clientSecret",
            "X-Api-Key",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["sslmode", "user", "host", "mode", "charset", "keyspace", ""] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn log_escaping_neutralises_line_breaks_and_terminal_controls() {
        assert_eq!(
            escape_for_log("ok\nERROR forged line\r\x1b[31mred\u{202e}"),
            "ok\\nERROR forged line\\r\\u{1b}[31mred\\u{202e}"
        );
        assert_eq!(escape_for_log("plain \\n text"), "plain \\n text");
        assert_eq!(escape_for_log("tab\there"), "tab\\there");
        assert_eq!(
            clean_stored_text("line 1\r\nline 2\n\tindented\x1b[2J\x07"),
            "line 1\nline 2\n\tindented\\u{1b}[2J\\u{7}"
        );
    }

    #[test]
    fn secrets_inside_libpq_options_are_masked() {
        // `options` carries `-c password=...` to the server.
        assert_eq!(
            redact_url("postgres://u@h/d?options=-c%20password%3DS3cr%21t&sslmode=disable"),
            "postgres://u@h/d?options=-c%20password%3D***&sslmode=disable"
        );
        assert_eq!(
            redact_url("postgres://u@h/d?options=-c+work_mem%3D4MB+-c+db_password%3DS3"),
            "postgres://u@h/d?options=-c%20work_mem%3D4MB%20-c%20db_password%3D***"
        );
        assert_eq!(
            redact_url("postgres://u@h/d?options=--password=S3&options[password]=S4"),
            "postgres://u@h/d?options=--password%3D***&options[password]=***"
        );
        // Not secret: kept as written.
        let plain = "postgres://u@h/d?options=-c%20search_path%3Dapp%2Cpublic";
        assert_eq!(redact_url(plain), plain);
        // The same inside free text (a driver's message, an unparseable URL).
        for text in [
            "cannot connect to postgres://u@h/d?options=-c%20password%3DS3cr3t: refused",
            "postgres://u@h/d?options=-c%20PWD%3dS3cr3t&x=1",
            "options=-c password=S3cr3t",
            "postgres://u@h/d?options%5Bpassword%5D=S3cr3t",
            "postgres://u@[h/d?options[password]=S3cr3t",
        ] {
            let masked = redact_text(text);
            assert!(!masked.contains("S3cr3t"), "{text} -> {masked}");
            assert!(masked.contains(MASK), "{masked}");
        }
        assert_eq!(
            redact_text("see postgres://u@h/d?options=-c%20password%3DS3cr3t&x=1."),
            "see postgres://u@h/d?options=-c%20password%3D***&x=1."
        );
        assert_eq!(redact_text("100%3D and a%3Db"), "100%3D and a%3Db");
        assert_eq!(redact_text("[key=abc] (token=t)"), "[key=***] (token=***)");
    }

    /// Properties: a URL's secrets never survive redaction in any form; escaped text holds
    /// no control character. 256 cases each (`PROPTEST_CASES` overrides).
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn cases() -> ProptestConfig {
            ProptestConfig {
                cases: std::env::var("PROPTEST_CASES")
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(256),
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        proptest! {
            #![proptest_config(cases())]

            #[test]
            fn url_secrets_never_survive_redaction(
                // Anything but `%`, which a URL password can only hold escaped (`%25`).
                password in "[A-Za-z0-9!#$&()*+,;=:/?@\\[\\] '\"~^|{}<>`-]{0,12}",
                token in "[A-Za-z0-9._~+/=-]{0,12}",
                name in prop::sample::select(vec![
                    "password", "PASSWORD", "passwd", "pwd", "token", "access_token", "api_key",
                    "apikey", "API-KEY", "key", "secret", "sslpassword", "auth", "Auth", "db_password",
                ]),
                scheme in prop::sample::select(vec!["postgres", "postgresql", "mysql", "mariadb", "https", "http"]),
                other in "[a-j]{1,8}",
            ) {
                // Distinctive, so a masked URL cannot contain them by accident.
                let password = format!("ZQpw{password}");
                let token = format!("ZQtk{token}");
                let mut url = url::Url::parse(&format!("{scheme}://user@db.internal:5432/orders")).unwrap();
                url.set_password(Some(&password)).unwrap();
                url.query_pairs_mut().append_pair(&format!("x{other}"), "1").append_pair(name, &token);
                let url = url.to_string();
                let shown = redact_url(&url);
                prop_assert!(!shown.contains("ZQ"), "{url} shown as {shown}");
                prop_assert!(shown.contains(&format!("x{other}=1")), "{shown}");
                let message = redact_text(&format!("error: cannot reach \"{url}\": refused"));
                prop_assert!(!message.contains("ZQ"), "{url} in {message}");
                let message = redact_in(&format!("driver said {password} and {token}"), &url);
                prop_assert!(!message.contains("ZQ"), "{message}");
            }

            #[test]
            fn escaped_text_holds_no_control_characters(text in any::<String>()) {
                let line = escape_for_log(&text);
                prop_assert!(!line.chars().any(char::is_control), "{:?}", line);
                let stored = clean_stored_text(&text);
                prop_assert!(
                    !stored.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
                    "{:?}",
                    stored
                );
            }
        }
    }
}
