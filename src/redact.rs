//! Keeping secrets out of output: database URLs are shown with their password masked.

/// Renders a database URL for messages and logs with any password replaced by `***`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        // Unparseable: keep only what follows the last `@`, which cannot hold a password.
        Err(_) => match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_string(),
        },
    }
}

/// Masks every occurrence of `url`'s password inside `text` (e.g. a driver's message).
pub fn redact_in(text: &str, url: &str) -> String {
    match url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        Some(password) if !password.is_empty() => text.replace(&password, "***"),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/orders"),
            "postgres://app:***@db:5432/orders"
        );
        assert_eq!(redact_url("sqlite:orders.db"), "sqlite:orders.db");
        assert!(!redact_in("auth failed for s3cret", "mysql://u:s3cret@h/d").contains("s3cret"));
    }
}
