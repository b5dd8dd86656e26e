//! Basic authentication against the file's `basic_auth_users`: reading the
//! `Authorization` header, checking the password against the user's bcrypt
//! hash, and remembering recent answers.
//!
//! Owns the bcrypt work and its bounds: one bcrypt at a time (later ones
//! wait their turn without a thread), on the endpoint runtime's blocking
//! pool, never on the sweep's threads; an unknown user costs the same
//! bcrypt as a known one (against a stand-in hash of the users' usual
//! cost), so timing does not tell which users exist. Answers are cached by a SHA-256 of user, hash and
//! password (the plaintext is not kept), in a bounded cache. It does not
//! build the 401 response (`scrape` does).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Answers remembered at most; past it a tenth is dropped. Bounds the
/// memory a stream of distinct wrong passwords can take.
pub const CACHE_CAPACITY: usize = 100;

/// The toolkit's stand-in hash (of `fakepassword`, cost 10). An unknown
/// user is checked against it, at the cost of the users' own hashes
/// (`dummy_hash`), so the answer takes as long as for a known one; even a
/// match is refused, the user being unknown.
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// The stand-in hash at the cost most of `users`' hashes have (the lower
/// on a tie, so a single costly hash does not make every unknown name
/// costly): with `htpasswd -B`'s default cost 5 an unknown user then costs
/// what a known one does, where the toolkit's fixed cost 10 would take
/// about 32 times longer and tell them apart. Only the cost is changed: the
/// salt and digest stay the toolkit's.
pub fn dummy_hash(users: &BTreeMap<String, String>) -> String {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for hash in users.values() {
        if let Ok(cost) = super::file::bcrypt_cost(hash) {
            *counts.entry(cost).or_default() += 1;
        }
    }
    let cost = counts
        .iter()
        .max_by(|(ca, na), (cb, nb)| na.cmp(nb).then(cb.cmp(ca)))
        .map_or(10, |(cost, _)| *cost);
    format!("$2y${cost:02}{}", &DUMMY_HASH[6..])
}

/// The user and password of a `Basic` `Authorization` header, as bytes.
/// None when the header is absent or not well-formed Basic credentials.
pub fn basic_credentials(header: Option<&[u8]>) -> Option<(Vec<u8>, Vec<u8>)> {
    let header = header?;
    let prefix = b"Basic ";
    if header.len() < prefix.len() || !header[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&header[prefix.len()..])
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

/// A bounded map from a digest of (user, hash, password) to whether they
/// matched.
#[derive(Default)]
struct Cache {
    answers: HashMap<[u8; 32], bool>,
}

impl Cache {
    fn get(&self, key: &[u8; 32]) -> Option<bool> {
        self.answers.get(key).copied()
    }

    fn set(&mut self, key: [u8; 32], ok: bool) {
        if self.answers.len() >= CACHE_CAPACITY {
            // Dropping a batch at once, as the toolkit does, so a full
            // cache is not trimmed on every miss. A HashMap's iteration
            // order differs per map, so which entries go is not for a
            // client to choose.
            let drop_count = (self.answers.len() / 10).max(1);
            let victims: Vec<[u8; 32]> = self.answers.keys().take(drop_count).copied().collect();
            for victim in victims {
                self.answers.remove(&victim);
            }
        }
        self.answers.insert(key, ok);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.answers.len()
    }
}

/// The cache key: each part length-prefixed, so no two different triples
/// hash the same input.
fn cache_key(user: &[u8], hash: &str, password: &[u8]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for part in [user, hash.as_bytes(), password] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.finalize().into()
}

/// Checks credentials; one per endpoint, shared by its connections and
/// kept across reloads of the file (its answers are keyed by the hash).
#[derive(Clone, Default)]
pub struct Authenticator {
    cache: Arc<Mutex<Cache>>,
    /// Held for the whole of a bcrypt, moved into the blocking task, so a
    /// connection cut off at its deadline cannot start a second bcrypt
    /// alongside one still running.
    bcrypt_turn: Arc<tokio::sync::Mutex<()>>,
}

impl Authenticator {
    /// Whether `header` carries the credentials of one of `users`.
    pub async fn allows(&self, users: &BTreeMap<String, String>, header: Option<&[u8]>) -> bool {
        let Some((user, password)) = basic_credentials(header) else {
            return false;
        };
        let known = std::str::from_utf8(&user).ok().and_then(|u| users.get(u));
        let hash = match known {
            Some(hash) => hash.clone(),
            None => dummy_hash(users),
        };
        let key = cache_key(&user, &hash, &password);
        let cached = self.cache.lock().map(|c| c.get(&key)).unwrap_or(None);
        let matched = match cached {
            Some(matched) => matched,
            None => {
                let turn = self.bcrypt_turn.clone().lock_owned().await;
                let matched = tokio::task::spawn_blocking(move || {
                    let _turn = turn;
                    // A hash the toolkit took but bcrypt cannot read matches nothing.
                    bcrypt::verify(&password, &hash).unwrap_or(false)
                })
                .await
                .unwrap_or(false);
                if let Ok(mut cache) = self.cache.lock() {
                    cache.set(key, matched);
                }
                matched
            }
        };
        matched && known.is_some()
    }

    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> Vec<u8> {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {token}").into_bytes()
    }

    fn users(password: &str) -> BTreeMap<String, String> {
        let hash = bcrypt::hash(password, 4).unwrap();
        BTreeMap::from([("alice".to_owned(), hash)])
    }

    #[test]
    fn credentials_are_read_as_the_toolkit_reads_them() {
        assert_eq!(
            basic_credentials(Some(&basic("a", "b:c"))),
            Some((b"a".to_vec(), b"b:c".to_vec()))
        );
        let lower = b"basic YTpi".to_vec();
        assert_eq!(
            basic_credentials(Some(&lower)),
            Some((b"a".to_vec(), b"b".to_vec()))
        );
        assert_eq!(basic_credentials(None), None);
        assert_eq!(basic_credentials(Some(b"Bearer YTpi")), None);
        assert_eq!(basic_credentials(Some(b"Basic !!!")), None);
        // No colon: not credentials.
        assert_eq!(basic_credentials(Some(b"Basic YWI=")), None);
    }

    #[tokio::test]
    async fn the_right_password_passes_and_others_do_not() {
        let auth = Authenticator::default();
        let users = users("s3cret");
        assert!(auth.allows(&users, Some(&basic("alice", "s3cret"))).await);
        assert!(!auth.allows(&users, Some(&basic("alice", "wrong"))).await);
        assert!(!auth.allows(&users, Some(&basic("mallory", "s3cret"))).await);
        assert!(!auth.allows(&users, None).await);
    }

    #[tokio::test]
    async fn an_htpasswd_2y_hash_is_checked() {
        // `htpasswd -nbB alice s3cret` prints a $2y$ hash.
        let hash = bcrypt::hash("s3cret", 4)
            .unwrap()
            .replacen("$2b$", "$2y$", 1);
        let users = BTreeMap::from([("alice".to_owned(), hash)]);
        let auth = Authenticator::default();
        assert!(auth.allows(&users, Some(&basic("alice", "s3cret"))).await);
    }

    #[tokio::test]
    async fn answers_are_cached_per_user_hash_and_password() {
        let auth = Authenticator::default();
        let users = users("s3cret");
        assert!(auth.allows(&users, Some(&basic("alice", "s3cret"))).await);
        assert!(auth.allows(&users, Some(&basic("alice", "s3cret"))).await);
        assert_eq!(auth.cached(), 1);
        assert!(!auth.allows(&users, Some(&basic("alice", "nope"))).await);
        assert_eq!(auth.cached(), 2);
        // A changed hash is a new key: the old answer is not reused.
        let changed = BTreeMap::from([("alice".to_owned(), bcrypt::hash("other", 4).unwrap())]);
        assert!(!auth.allows(&changed, Some(&basic("alice", "s3cret"))).await);
        assert_eq!(auth.cached(), 3);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut cache = Cache::default();
        for i in 0..(CACHE_CAPACITY * 3) {
            cache.set(cache_key(b"u", "h", &i.to_be_bytes()), false);
            assert!(cache.len() <= CACHE_CAPACITY);
        }
    }

    #[test]
    fn the_cache_key_keeps_no_plaintext_and_separates_parts() {
        assert_ne!(cache_key(b"ab", "c", b"d"), cache_key(b"a", "bc", b"d"));
        let key = cache_key(b"alice", "h", b"s3cret");
        assert!(!key.windows(6).any(|w| w == b"s3cret"));
    }

    #[test]
    fn the_dummy_hash_takes_the_users_usual_cost() {
        let cost = |hashes: &[&str]| {
            let users = hashes
                .iter()
                .enumerate()
                .map(|(i, h)| (i.to_string(), (*h).to_owned()))
                .collect();
            let dummy = dummy_hash(&users);
            assert!(bcrypt::verify("fakepassword", &dummy).is_ok(), "{dummy}");
            super::super::file::bcrypt_cost(&dummy).unwrap()
        };
        let at =
            |c: u32| format!("$2y${c:02}$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a");
        assert_eq!(cost(&[]), 10);
        assert_eq!(cost(&[&at(5)]), 5);
        assert_eq!(cost(&[&at(5), &at(5), &at(12)]), 5);
        assert_eq!(cost(&[&at(6), &at(31)]), 6);
    }

    #[test]
    fn the_toolkits_dummy_hash_is_well_formed() {
        assert_eq!(super::super::file::bcrypt_cost(DUMMY_HASH), Ok(10));
        assert_eq!(bcrypt::verify("fakepassword", DUMMY_HASH).ok(), Some(true));
    }
}
