//! libpq's password file (`~/.pgpass`, or `passfile` / `PGPASSFILE`).
//!
//! Owns reading it (ignored, with a note, unless a plain file without group
//! or world access), and finding each host's line with libpq's rules. It
//! does not decide which file or whether one is needed (`target` does) and
//! never puts a password in a note.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use crate::types::{Addr, Host};

/// libpq's compiled-in socket directory on Debian: for the password file it
/// counts as `localhost`.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";
/// The host name a line must carry for a host given as nothing at all.
const DEFAULT_HOST: &str = "localhost";

/// The file's lines, or `None` when it is absent or must be ignored (not a
/// plain file; group or world access, as libpq refuses it).
pub fn read(path: &Path, notes: &mut Vec<String>) -> Option<Vec<String>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        notes.push(format!(
            "password file {:?} is not a plain file; it is ignored",
            path.display().to_string()
        ));
        return None;
    }
    if meta.mode() & 0o077 != 0 {
        notes.push(format!(
            "password file {:?} has group or world access; permissions should be u=rw (0600) or \
             less; it is ignored",
            path.display().to_string()
        ));
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.lines().map(str::to_owned).collect())
}

/// The password of the first line matching `host:port:dbname:user`, with
/// libpq's rules: `*` matches anything, `\:` and `\\` escape, `#` starts a
/// comment line. The host field is matched with `host` as given, else
/// `hostaddr`, else `localhost`; the default socket directory counts as
/// `localhost`.
pub fn password_for(lines: &[String], host: &Host, dbname: &str, user: &str) -> Option<String> {
    let hostname = match (&host.name, &host.addr) {
        (Some(name), _) if name == DEFAULT_SOCKET_DIR => DEFAULT_HOST.to_owned(),
        (Some(name), _) => name.clone(),
        (None, Addr::HostAddr(ip)) => ip.to_string(),
        (None, _) => DEFAULT_HOST.to_owned(),
    };
    let port = host.port.to_string();
    let wanted = [hostname.as_str(), port.as_str(), dbname, user];
    for line in lines {
        let line = line.trim_end_matches('\r');
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let fields = split_line(line);
        if fields.len() < 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(wanted)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone()).filter(|p| !p.is_empty());
        }
    }
    None
}

/// Splits on unescaped `:` into at most five fields, unescaping `\x` to `x`.
fn split_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().expect("non-empty").push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("non-empty").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn host(addr: Addr, name: Option<&str>) -> Host {
        Host {
            addr,
            port: 5432,
            name: name.map(str::to_owned),
            password: None,
        }
    }

    #[test]
    fn the_host_field_is_matched_as_libpq_matches_it() {
        let lines: Vec<String> = [
            "localhost:5432:db:u:local",
            "db.example:5432:db:u:by-name",
            "10.0.0.7:5432:db:u:by-address",
            "/srv/pg:5432:db:u:by-socket-dir",
        ]
        .map(str::to_owned)
        .into();
        let ip = Addr::HostAddr("10.0.0.7".parse().unwrap());
        let pw = |h: &Host| password_for(&lines, h, "db", "u");
        // hostaddr with a name: the name; without: the address.
        assert_eq!(
            pw(&host(ip.clone(), Some("db.example"))).as_deref(),
            Some("by-name")
        );
        assert_eq!(pw(&host(ip, None)).as_deref(), Some("by-address"));
        // Nothing given, whichever socket or TCP default it became: localhost.
        let tmp = Addr::Socket(PathBuf::from("/tmp"));
        assert_eq!(pw(&host(tmp, None)).as_deref(), Some("local"));
        let default_dir = Addr::Socket(PathBuf::from(DEFAULT_SOCKET_DIR));
        assert_eq!(
            pw(&host(default_dir, Some(DEFAULT_SOCKET_DIR))).as_deref(),
            Some("local")
        );
        let other_dir = Addr::Socket(PathBuf::from("/srv/pg"));
        assert_eq!(
            pw(&host(other_dir, Some("/srv/pg"))).as_deref(),
            Some("by-socket-dir")
        );
    }
}
