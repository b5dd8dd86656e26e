//! etcd's own lock layout, and what a change to it means: which keys are
//! lock keys, which of them holds its lock, and whether a holder's key that
//! went away was released, expired or revoked. Pure: no I/O, no clock (the
//! caller passes the times), so every rule here has a unit test. The watch
//! that feeds it is `watch`; the claims and lines are `store`'s.
//!
//! The layout is the one etcd's v3 lock service (`etcdctl lock`, the `Lock`
//! RPC) and its client mutex write: a lock named `N` is a set of keys
//! `N/<lease id in lowercase hex>`, each attached to that lease and with an
//! empty value. The key with the lowest create revision holds the lock; the
//! others wait for it.

use std::collections::{BTreeMap, HashMap, HashSet};

/// The name of the lock a key belongs to, if the key is a lock key: its
/// last segment is the lowercase hex of the lease it is attached to, and
/// its value is empty.
///
/// The lease check is what keeps an ordinary key that happens to end in hex
/// out: a key whose name says one lease and which carries another (or none)
/// is not a lock. The empty value keeps election keys out: etcd's election
/// writes the same `<name>/<lease hex>` layout, with the candidate's
/// proposal as the value, and a leader that leaves is not a lock's expiry.
pub fn lock_name<'k>(key: &'k [u8], value: &[u8], lease: i64) -> Option<&'k [u8]> {
    if lease <= 0 || !value.is_empty() {
        return None;
    }
    let slash = key.iter().rposition(|b| *b == b'/')?;
    let (name, id) = (&key[..slash], &key[slash + 1..]);
    (id == format!("{lease:x}").as_bytes()).then_some(name)
}

/// A holder's key that went away, as the watch saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// The whole key (`<name>/<lease hex>`).
    pub key: Vec<u8>,
    pub lease: i64,
    /// The key's create revision: the token etcd's lock handed its holder.
    pub create_revision: i64,
    /// The revision of the deletion: with `create_revision`, names this
    /// deletion uniquely across replicas and restarts.
    pub revision: i64,
}

/// One lock's keys by create revision, each with its lease: the first
/// holds, the rest wait in order.
type Queue = BTreeMap<i64, (Vec<u8>, i64)>;

/// What the watch knows of every lock: its keys in create order, and the
/// deadline last learned of each lease that holds one.
#[derive(Debug, Default)]
pub struct LockTable {
    /// Lock name → its keys. The first entry holds.
    locks: HashMap<Vec<u8>, Queue>,
    /// Lease → how many lock keys it carries, so a lease is forgotten with
    /// its last key.
    keys_of: HashMap<i64, u32>,
    /// Lease → its deadline (epoch ms, the sidecar's clock) as last learned.
    deadlines: HashMap<i64, i64>,
    /// Leases that began to hold a lock with no deadline known, to be asked
    /// at once (`take_fresh`): a holder revoked a moment after it locked is
    /// told from an expiry only if its deadline was learned in between.
    fresh: Vec<i64>,
    /// Leases etcd answered gone while a lock key still carried them: their
    /// deletions are on the way, and asking again would only cost etcd (a
    /// mass expiry would ask each one every tick until its deletion came).
    gone: HashSet<i64>,
}

impl LockTable {
    /// A key was written. Only a new lock key changes anything.
    pub fn put(&mut self, key: &[u8], value: &[u8], lease: i64, create_revision: i64) {
        let Some(name) = lock_name(key, value, lease) else {
            return;
        };
        let keys = self.locks.entry(name.to_vec()).or_default();
        if keys
            .insert(create_revision, (key.to_vec(), lease))
            .is_none()
        {
            *self.keys_of.entry(lease).or_default() += 1;
            let holds = keys.keys().next() == Some(&create_revision);
            if holds && !self.deadlines.contains_key(&lease) {
                self.fresh.push(lease);
            }
        }
    }

    /// The leases that began to hold since the last call with no deadline
    /// known.
    pub fn take_fresh(&mut self) -> Vec<i64> {
        let mut fresh = std::mem::take(&mut self.fresh);
        fresh.sort_unstable();
        fresh.dedup();
        fresh
    }

    /// A key was deleted (`prev_*` is what it held, from the event's
    /// previous value) at `revision`: the holder's key if it held its lock,
    /// `None` for a waiter's key or a key that is no lock key.
    pub fn delete(
        &mut self,
        key: &[u8],
        prev_value: &[u8],
        lease: i64,
        create_revision: i64,
        revision: i64,
    ) -> Option<Gone> {
        let name = lock_name(key, prev_value, lease)?;
        let keys = self.locks.get_mut(name)?;
        let held = keys.keys().next() == Some(&create_revision);
        keys.remove(&create_revision)?;
        match keys.values().next() {
            None => {
                self.locks.remove(name);
            }
            Some((_, next)) if held && !self.deadlines.contains_key(next) => {
                self.fresh.push(*next);
            }
            Some(_) => {}
        }
        if let Some(n) = self.keys_of.get_mut(&lease) {
            *n -= 1;
            if *n == 0 {
                self.keys_of.remove(&lease);
                // The deadline stays until the deletions are classified
                // (`deadline`, then `forget`): it is what tells an expiry
                // from a revoke, for every lock the lease carried.
            }
        }
        held.then(|| Gone {
            key: key.to_vec(),
            lease,
            create_revision,
            revision,
        })
    }

    /// Locks held now (`lock.held.current`).
    pub fn held(&self) -> usize {
        self.locks.len()
    }

    /// The leases of holders whose deadline is unknown or due within
    /// `ahead_ms` of `now_ms`: asking them now keeps each holder's deadline
    /// known before it can pass.
    pub fn due(&self, now_ms: i64, ahead_ms: i64) -> Vec<i64> {
        let mut due: Vec<i64> = self
            .locks
            .values()
            .filter_map(|keys| keys.values().next().map(|(_, lease)| *lease))
            .filter(|lease| !self.gone.contains(lease))
            .filter(|lease| {
                self.deadlines
                    .get(lease)
                    .is_none_or(|d| d - now_ms <= ahead_ms)
            })
            .collect();
        due.sort_unstable();
        due.dedup();
        due
    }

    /// Records what etcd answered for `lease`: `ttl_secs` left when asked at
    /// `asked_ms`, or gone (`ttl_secs` < 0), which leaves the last deadline
    /// learned standing.
    pub fn learned(&mut self, lease: i64, asked_ms: i64, ttl_secs: i64) {
        if !self.keys_of.contains_key(&lease) {
            return;
        }
        if ttl_secs >= 0 {
            self.deadlines.insert(lease, deadline(asked_ms, ttl_secs));
        } else {
            self.gone.insert(lease);
        }
    }

    /// The deadline last learned of `lease`.
    pub fn deadline(&self, lease: i64) -> Option<i64> {
        self.deadlines.get(&lease).copied()
    }

    /// Forgets `lease`'s deadline if no lock key carries the lease any more:
    /// called once every deletion of a watch response is classified, since
    /// one lease may carry several locks (one session, several mutexes).
    pub fn forget(&mut self, lease: i64) {
        if !self.keys_of.contains_key(&lease) {
            self.deadlines.remove(&lease);
            self.gone.remove(&lease);
        }
    }
}

/// A lease's deadline from a `TimeToLive` answer: etcd gives the time left
/// in whole seconds, rounded down, so this is the earliest the deadline can
/// be, never later than the real one (up to a second earlier).
pub fn deadline(asked_ms: i64, ttl_secs: i64) -> i64 {
    asked_ms + ttl_secs * 1000
}

/// What happened to a holder's key, by what etcd says of its lease now and
/// what the sidecar last learned of its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Deleted while its lease lives: the holder unlocked. Not reported.
    Released,
    /// Its lease is gone, and the deletion was seen at or after the
    /// deadline last learned (or no deadline was known): the lease ran out.
    Expired { deadline_ms: i64, overdue_ms: i64 },
    /// Its lease is gone, and the deletion was seen before the deadline
    /// last learned: revoked by its holder (a lease revoke, or a session
    /// closed without an unlock) while it held the lock.
    Revoked { seen_ms: i64 },
}

/// Tells a holder's deletion apart. `lease_alive`: etcd still has the
/// lease. `seen_ms`: when the sidecar saw the deletion. `deadline_ms`: the
/// deadline last learned (`deadline`), which is never later than the real
/// one, so an expiry is never taken for a revoke; a revoke in the last
/// second or so before the real deadline is taken for an expiry.
pub fn classify(lease_alive: bool, seen_ms: i64, deadline_ms: Option<i64>) -> Verdict {
    match (lease_alive, deadline_ms) {
        (true, _) => Verdict::Released,
        (false, Some(d)) if seen_ms < d => Verdict::Revoked { seen_ms },
        (false, Some(d)) => Verdict::Expired {
            deadline_ms: d,
            overdue_ms: seen_ms - d,
        },
        (false, None) => Verdict::Expired {
            deadline_ms: seen_ms,
            overdue_ms: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: i64 = 0x694d_7a2c_1f3b_0a11;

    fn key(name: &str, lease: i64) -> Vec<u8> {
        format!("{name}/{lease:x}").into_bytes()
    }

    #[test]
    fn a_lock_key_ends_in_the_hex_of_its_own_lease_and_holds_no_value() {
        assert_eq!(
            lock_name(&key("locks/a", LEASE), b"", LEASE),
            Some(&b"locks/a"[..])
        );
        assert_eq!(lock_name(&key("locks/a", LEASE), b"", LEASE + 1), None);
        assert_eq!(lock_name(&key("locks/a", LEASE), b"", 0), None);
        assert_eq!(
            lock_name(&key("elect/a", LEASE), b"candidate-1", LEASE),
            None,
            "an election key carries its proposal as its value"
        );
        assert_eq!(
            lock_name(format!("{LEASE:X}").as_bytes(), b"", LEASE),
            None,
            "no name"
        );
        assert_eq!(
            lock_name(format!("a/{LEASE:X}").as_bytes(), b"", LEASE),
            None,
            "etcd writes lowercase hex"
        );
    }

    #[test]
    fn the_first_key_created_holds_and_a_waiters_key_going_is_no_holder_gone() {
        let mut t = LockTable::default();
        t.put(&key("l", 1), b"", 1, 10);
        t.put(&key("l", 2), b"", 2, 11);
        t.put(b"other/key", b"x", 0, 12);
        assert_eq!(t.held(), 1);
        assert_eq!(t.delete(&key("l", 2), b"", 2, 11, 13), None, "a waiter");
        let gone = t.delete(&key("l", 1), b"", 1, 10, 14).unwrap();
        assert_eq!(
            (gone.lease, gone.create_revision, gone.revision),
            (1, 10, 14)
        );
        assert_eq!(t.held(), 0);
    }

    #[test]
    fn a_waiter_becomes_the_holder_when_the_holder_goes() {
        let mut t = LockTable::default();
        t.put(&key("l", 1), b"", 1, 10);
        t.put(&key("l", 2), b"", 2, 11);
        assert_eq!(t.due(0, 1000), vec![1], "only holders' leases are asked");
        assert_eq!(t.take_fresh(), vec![1], "a new holder is asked at once");
        t.delete(&key("l", 1), b"", 1, 10, 12).unwrap();
        assert_eq!(t.due(0, 1000), vec![2]);
        assert_eq!(t.take_fresh(), vec![2], "so is a waiter that comes to hold");
        assert!(t.delete(&key("l", 2), b"", 2, 11, 13).is_some());
    }

    #[test]
    fn a_deadline_is_asked_again_only_when_due() {
        let mut t = LockTable::default();
        t.put(&key("l", 1), b"", 1, 10);
        t.learned(1, 0, 60);
        assert!(t.due(0, 1500).is_empty());
        assert_eq!(t.due(58_500, 1500), vec![1]);
        t.learned(1, 59_000, -1);
        assert_eq!(
            t.deadline(1),
            Some(60_000),
            "a gone lease keeps its last deadline"
        );
        assert!(
            t.due(61_000, 1500).is_empty(),
            "and is not asked again while its deletion is on the way"
        );
    }

    #[test]
    fn a_deadline_outlives_its_keys_until_forgotten() {
        let mut t = LockTable::default();
        t.put(&key("a", 1), b"", 1, 10);
        t.put(&format!("b/{:x}", 1).into_bytes(), b"", 1, 11);
        t.learned(1, 0, 5);
        t.delete(&key("a", 1), b"", 1, 10, 12);
        t.delete(&format!("b/{:x}", 1).into_bytes(), b"", 1, 11, 12);
        assert_eq!(
            (t.deadline(1), t.deadline(1)),
            (Some(5000), Some(5000)),
            "both locks of one lease see its deadline"
        );
        t.forget(1);
        assert_eq!(t.deadline(1), None);
    }

    #[test]
    fn a_deletion_is_released_expired_or_revoked_by_the_lease_and_its_deadline() {
        assert_eq!(classify(true, 10_000, Some(5_000)), Verdict::Released);
        assert_eq!(
            classify(false, 10_000, Some(9_000)),
            Verdict::Expired {
                deadline_ms: 9_000,
                overdue_ms: 1_000
            }
        );
        assert_eq!(
            classify(false, 9_000, Some(9_000)),
            Verdict::Expired {
                deadline_ms: 9_000,
                overdue_ms: 0
            }
        );
        assert_eq!(
            classify(false, 8_999, Some(9_000)),
            Verdict::Revoked { seen_ms: 8_999 }
        );
        assert_eq!(
            classify(false, 8_000, None),
            Verdict::Expired {
                deadline_ms: 8_000,
                overdue_ms: 0
            },
            "no deadline known: an expiry, the lease being gone"
        );
    }
}
