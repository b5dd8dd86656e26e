//! What a connection string says: the `postgres://` URL and libpq's
//! `key=value` form, turned into libpq parameters, and which parameters are
//! understood, ignored or refused.
//!
//! Owns the syntax (libpq's URI grammar: multi-host `h1:p1,h2:p2`,
//! bracketed IPv6, percent-decoding without `%00`, query parameters with
//! exactly one `=`; `key=value` with quoting and backslash escapes) and the
//! parameter tables. It does not give values meaning (ports, modes, hosts
//! are checked by `target`), read the environment, or echo a value that
//! may be a secret: errors name the part of the string that is wrong.

use crate::types::Params;

/// The connection parameters acted on (libpq's names).
pub const KNOWN_PARAMS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "connect_timeout",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "fallback_application_name",
    "options",
    "target_session_attrs",
];

/// libpq parameters accepted but not acted on, with the one value that must
/// be refused because ignoring it would weaken what the operator asked for
/// (`None`: any value is harmless to ignore). Each ignored one is a note.
pub const IGNORED_PARAMS: &[(&str, Option<&str>)] = &[
    ("keepalives", None),
    ("keepalives_idle", None),
    ("keepalives_interval", None),
    ("keepalives_count", None),
    ("tcp_user_timeout", None),
    ("sslcompression", None),
    ("sslsni", None),
    ("gssencmode", Some("require")),
    ("channel_binding", Some("require")),
    ("sslnegotiation", Some("direct")),
];

/// The URI schemes libpq recognises.
const URI_PREFIXES: &[&str] = &["postgresql://", "postgres://"];

/// Whether `s` is a URI (else it is read as `key=value` pairs).
pub fn is_uri(s: &str) -> bool {
    URI_PREFIXES.iter().any(|p| s.starts_with(p))
}

/// Parses a connection string of either form into libpq parameters, as
/// libpq's `PQconninfoParse` does: nothing from the environment.
pub fn parse(s: &str) -> Result<Params, String> {
    if is_uri(s) {
        parse_uri(s)
    } else {
        parse_key_values(s)
    }
}

/// Refuses parameters that are neither known nor safely ignored, and drops
/// the ignored ones, returning a note for each. An unknown parameter is a
/// configuration error on purpose, where libpq's URI parser only warns: a
/// typo (`target_session_atrs`) would otherwise silently connect to a
/// standby or without TLS. Values are never echoed (`sslpassword` is one).
pub fn vet(params: &mut Params) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    let mut ignored = Vec::new();
    for (key, value) in params.iter() {
        if KNOWN_PARAMS.contains(&key.as_str()) {
            continue;
        }
        match IGNORED_PARAMS.iter().find(|(k, _)| k == key) {
            Some((_, Some(refused))) if value == refused => {
                return Err(format!(
                    "unsupported parameter {key}={value} (supported: {})",
                    KNOWN_PARAMS.join(", ")
                ));
            }
            Some(_) => {
                notes.push(format!(
                    "connection parameter {key} is not supported by lease-sweeper and is ignored"
                ));
                ignored.push(key.clone());
            }
            None => {
                return Err(format!(
                    "unsupported parameter {key} (supported: {})",
                    KNOWN_PARAMS.join(", ")
                ));
            }
        }
    }
    for key in ignored {
        params.remove(&key);
    }
    Ok(notes)
}

/// The password exactly as written in a URI (still percent-encoded), so a
/// message echoing the raw string is scrubbed too.
pub fn raw_uri_password(s: &str) -> Option<&str> {
    let rest = URI_PREFIXES.iter().find_map(|p| s.strip_prefix(p))?;
    let netloc = rest.split(['/', '?']).next()?;
    let (userinfo, _) = netloc.split_once('@')?;
    userinfo.split_once(':').map(|(_, p)| p)
}

/// libpq's URI: `postgres[ql]://[user[:password]@][host[:port][,...]][/dbname][?k=v[&...]]`.
fn parse_uri(s: &str) -> Result<Params, String> {
    let rest = URI_PREFIXES
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .ok_or("it must start with postgres:// or postgresql://")?;
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (netloc, path) = match before_query.split_once('/') {
        Some((n, p)) => (n, Some(p)),
        None => (before_query, None),
    };
    let mut params = Params::new();
    let hostlist = match netloc.split_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                params.insert("user".into(), decode(user, "user name")?);
            }
            if let Some(p) = password {
                params.insert("password".into(), decode(p, "password")?);
            }
            hosts
        }
        None => netloc,
    };
    let (hosts, ports) = parse_hostlist(hostlist)?;
    if hosts.iter().any(|h| !h.is_empty()) {
        params.insert("host".into(), hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        params.insert("port".into(), ports.join(","));
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        params.insert("dbname".into(), decode(db, "database name")?);
    }
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            format!("missing key/value separator \"=\" in URI query parameter {pair:?}")
        })?;
        if v.contains('=') {
            return Err(format!(
                "extra key/value separator \"=\" in URI query parameter {k:?}"
            ));
        }
        let k = decode(k, "name of a query parameter")?;
        let v = decode(v, &format!("value of query parameter {k}"))?;
        // JDBC's spelling, which libpq accepts too.
        if k == "ssl" && v == "true" {
            params.insert("sslmode".into(), "require".into());
        } else {
            params.insert(k, v);
        }
    }
    Ok(params)
}

/// `host[:port][,host[:port]...]` with `[v6]` hosts: each host decoded, each
/// port as written (checked by `target`), both lists as long as the list.
fn parse_hostlist(list: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    for spec in list.split(',') {
        let (host, port) = if let Some(v6) = spec.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("missing \"]\" after the IPv6 host address in {spec:?}"))?;
            if h.is_empty() {
                return Err("the IPv6 host address between \"[\" and \"]\" is empty".to_owned());
            }
            let port = match after {
                "" => "",
                p => p.strip_prefix(':').ok_or_else(|| {
                    format!(
                        "unexpected {p:?} after the IPv6 host address (expected \":\" or \"/\")"
                    )
                })?,
            };
            (h.to_owned(), port)
        } else {
            match spec.split_once(':') {
                Some((h, p)) => (decode(h, "host")?, p),
                None => (decode(spec, "host")?, ""),
            }
        };
        hosts.push(host);
        ports.push(port.to_owned());
    }
    Ok((hosts, ports))
}

/// Parses libpq's `key=value key='quoted \' value'` form.
fn parse_key_values(s: &str) -> Result<Params, String> {
    let mut params = Params::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(params);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(format!(
                "missing \"=\" after {key:?} (expected key=value pairs or a postgres:// URL)"
            ));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("unterminated quoted value for {key:?}")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        params.insert(key, value);
    }
}

/// Percent-decoding as libpq does it (`+` stays `+`), refusing `%00` as
/// libpq does: a NUL would cut the value short in every C client.
fn decode(s: &str, what: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = s
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoded token in the {what}"))?;
            if byte == 0 {
                return Err(format!("forbidden value %00 in the {what}"));
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the percent-encoded {what} is not UTF-8"))
}

/// Percent-encodes what would break a URL's structure.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_refuses_nul_and_bad_tokens_without_echoing_them() {
        assert_eq!(decode("a%20b+c", "host").unwrap(), "a b+c");
        assert_eq!(
            decode("a%00b", "host").unwrap_err(),
            "forbidden value %00 in the host"
        );
        for bad in ["%zz", "%1", "%", "%+1"] {
            let err = decode(&format!("s3cret{bad}"), "password").unwrap_err();
            assert_eq!(
                err, "invalid percent-encoded token in the password",
                "{bad}"
            );
        }
    }

    #[test]
    fn an_empty_ipv6_host_is_refused() {
        let err = parse("postgres://[]").unwrap_err();
        assert!(err.contains("IPv6 host address"), "{err}");
        assert!(parse("postgres://[::1]:5433,[fe80::1]/db").is_ok());
    }

    #[test]
    fn vetting_drops_the_harmless_and_refuses_the_rest() {
        let mut p = parse("postgres://h/db?keepalives=1&gssencmode=disable").unwrap();
        assert_eq!(vet(&mut p).unwrap().len(), 2);
        assert!(!p.contains_key("keepalives"));
        let mut p = parse("postgres://h/db?channel_binding=require").unwrap();
        assert!(
            vet(&mut p)
                .unwrap_err()
                .starts_with("unsupported parameter channel_binding")
        );
        let mut p = parse("host=h sslpassword=hunter2").unwrap();
        let err = vet(&mut p).unwrap_err();
        assert!(
            err.starts_with("unsupported parameter sslpassword ("),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
    }
}
