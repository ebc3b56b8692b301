//! ZooKeeper's access control: the identities a connection holds (`ip:<its address>` from the
//! start, `digest:user:hash` after `addauth digest user:password`), the ACLs a create or
//! setACL may give (`fixup`: ZooKeeper's fixupACL, with its INVALIDACL cases), and whether an
//! ACL lets those identities do something (`permits`: checkACL). Writes are checked where they
//! are applied, from the identities their command carries, so that the check sees the ACL a
//! concurrent setACL left, in log order; reads are checked on the node that serves them.

use serde::{Deserialize, Serialize};

use crate::proto::codes::ErrorCode;
use crate::proto::records::Acl;

/// `ZooDefs.Perms`.
pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 2;
    pub const CREATE: i32 = 4;
    pub const DELETE: i32 = 8;
    pub const ADMIN: i32 = 16;
    pub const ALL: i32 = READ | WRITE | CREATE | DELETE | ADMIN;
}

/// One identity of a connection: `scheme:id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthId {
    pub scheme: String,
    pub id: String,
}

impl AuthId {
    /// The identity every connection has: its client's address.
    pub fn ip(addr: std::net::IpAddr) -> AuthId {
        let addr = match addr {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
            v4 => v4,
        };
        AuthId { scheme: "ip".into(), id: addr.to_string() }
    }
}

/// The identities `addauth scheme credentials` gives, or `None` when the scheme is unknown or
/// the credentials malformed (ZooKeeper answers AUTHFAILED and closes the connection). A digest
/// equal to the configured super digest (ZooKeeper's
/// `zookeeper.DigestAuthenticationProvider.superDigest`) also gives `super:`, which every ACL
/// admits.
pub fn authenticate(scheme: &str, credentials: &[u8], super_digest: Option<&str>) -> Option<Vec<AuthId>> {
    match scheme {
        "digest" => {
            let text = std::str::from_utf8(credentials).ok()?;
            let (user, _) = text.split_once(':')?;
            let digest = AuthId { scheme: "digest".into(), id: format!("{user}:{}", digest_hash(text)) };
            let mut ids = Vec::with_capacity(2);
            if super_digest == Some(digest.id.as_str()) {
                ids.push(AuthId { scheme: SUPER.into(), id: String::new() });
            }
            ids.push(digest);
            Some(ids)
        }
        _ => None,
    }
}

/// The scheme of the superuser's identity: no ACL entry names it, every check admits it.
const SUPER: &str = "super";

/// Checks a super digest as a configuration gives it: `user:hash`, the hash the base64 of a
/// SHA-1 (what `DigestAuthenticationProvider.generateDigest` prints).
pub fn validate_super_digest(digest: &str) -> Result<(), String> {
    use base64::Engine;
    let Some((user, hash)) = digest.split_once(':') else {
        return Err(format!("the super digest {digest:?} is not USER:HASH"));
    };
    let decoded = base64::engine::general_purpose::STANDARD.decode(hash).ok();
    if user.is_empty() || decoded.is_none_or(|sha| sha.len() != 20) {
        return Err(format!(
            "the super digest {digest:?} is not USER:HASH with the base64 of a SHA-1 as the hash \
             (`echo -n user:password | openssl sha1 -binary | base64` makes one)"
        ));
    }
    Ok(())
}

/// `DigestAuthenticationProvider.generateDigest`: base64 of the SHA-1 of `user:password`.
fn digest_hash(user_password: &str) -> String {
    use base64::Engine;
    let sha = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, user_password.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha.as_ref())
}

/// The ACL a create or setACL stores: `auth` entries become one entry per authenticated
/// identity of the connection (its digests), every other entry must be valid for its scheme,
/// duplicates go. INVALIDACL for an empty list, an unknown scheme, a malformed id, or `auth`
/// from a connection that authenticated nothing.
pub fn fixup(acl: &[Acl], auth: &[AuthId]) -> Result<Vec<Acl>, ErrorCode> {
    if acl.is_empty() {
        return Err(ErrorCode::InvalidAcl);
    }
    let mut fixed: Vec<Acl> = Vec::with_capacity(acl.len());
    let mut push = |entry: Acl| {
        if !fixed.contains(&entry) {
            fixed.push(entry);
        }
    };
    for entry in acl {
        match entry.scheme.as_str() {
            "world" if entry.id == "anyone" => push(entry.clone()),
            "auth" => {
                let mut any = false;
                // Only schemes that authenticate a user count: an address is not one.
                for id in auth.iter().filter(|id| id.scheme == "digest") {
                    any = true;
                    push(Acl { perms: entry.perms, scheme: id.scheme.clone(), id: id.id.clone() });
                }
                if !any {
                    return Err(ErrorCode::InvalidAcl);
                }
            }
            "digest" if entry.id.split(':').count() == 2 => push(entry.clone()),
            "ip" if parse_ip_pattern(&entry.id).is_some() => push(entry.clone()),
            _ => return Err(ErrorCode::InvalidAcl),
        }
    }
    Ok(fixed)
}

/// Whether `acl` grants `perm` (any of its bits) to one of `auth`. An empty ACL grants all,
/// as in ZooKeeper (nodes restored from old snapshots may have one), and so does `super`.
pub fn permits(acl: &[Acl], auth: &[AuthId], perm: i32) -> bool {
    if acl.is_empty() || auth.iter().any(|id| id.scheme == SUPER) {
        return true;
    }
    acl.iter().filter(|entry| entry.perms & perm != 0).any(|entry| match entry.scheme.as_str() {
        "world" => entry.id == "anyone",
        "ip" => auth.iter().any(|id| id.scheme == "ip" && ip_matches(&entry.id, &id.id)),
        scheme => auth.iter().any(|id| id.scheme == scheme && id.id == entry.id),
    })
}

/// The ACL as getACL shows it to a client without ADMIN: digests' hashes replaced by `x`.
pub fn redacted(acl: &[Acl]) -> Vec<Acl> {
    acl.iter()
        .map(|entry| match (entry.scheme.as_str(), entry.id.split_once(':')) {
            ("digest", Some((user, _))) => Acl { id: format!("{user}:x"), ..entry.clone() },
            _ => entry.clone(),
        })
        .collect()
}

/// `address[/bits]` as bytes and the number of leading bits that must match.
fn parse_ip_pattern(pattern: &str) -> Option<(Vec<u8>, u32)> {
    let (addr, bits) = match pattern.split_once('/') {
        Some((addr, bits)) => (addr, Some(bits.parse::<u32>().ok()?)),
        None => (pattern, None),
    };
    let bytes = match addr.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let max = bytes.len() as u32 * 8;
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some((bytes, bits))
}

/// `IPAuthenticationProvider.matches`: the client's address within the pattern's network.
fn ip_matches(pattern: &str, client: &str) -> bool {
    let (Some((network, bits)), Some((addr, _))) = (parse_ip_pattern(pattern), parse_ip_pattern(client)) else {
        return false;
    };
    if network.len() != addr.len() {
        return false;
    }
    let whole = (bits / 8) as usize;
    let rest = bits % 8;
    network[..whole] == addr[..whole]
        && (rest == 0 || {
            let mask = 0xffu8 << (8 - rest);
            network[whole] & mask == addr[whole] & mask
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(perms: i32, scheme: &str, id: &str) -> Acl {
        Acl { perms, scheme: scheme.into(), id: id.into() }
    }

    #[test]
    fn digests_are_zookeepers() {
        // The id kazoo's make_digest_acl("ann", "pw") computes, and ZooKeeper checks against.
        let ann = digest("ann:pw");
        assert_eq!(ann.id, "ann:RYbu6l5aZwqon8VWmkcGvezdzfc=");
        assert!(authenticate("digest", b"no colon", None).is_none());
        assert!(authenticate("kerberos", b"x", None).is_none());
    }

    fn digest(credentials: &str) -> AuthId {
        let mut ids = authenticate("digest", credentials.as_bytes(), None).expect("digest");
        assert_eq!(ids.len(), 1);
        ids.remove(0)
    }

    #[test]
    fn the_super_digest_admits_everything() {
        // kazoo's test harness configures ZooKeeper with this digest of super:test.
        let configured = "super:D/InIHSb7yEEbrWz8b9l71RjZJU=";
        validate_super_digest(configured).expect("valid");
        let ids = authenticate("digest", b"super:test", Some(configured)).expect("digest");
        assert_eq!(ids[0].scheme, "super");
        assert_eq!(ids[1], AuthId { scheme: "digest".into(), id: configured.into() });
        let locked = [acl(perms::READ, "digest", "ann:RYbu6l5aZwqon8VWmkcGvezdzfc=")];
        assert!(permits(&locked, &ids, perms::ADMIN));
        let wrong = authenticate("digest", b"super:guess", Some(configured)).expect("digest");
        assert!(!permits(&locked, &wrong, perms::READ));
        for bad in ["nohash", ":D/InIHSb7yEEbrWz8b9l71RjZJU=", "super:c2hvcnQ=", "super:not base64!"] {
            assert!(validate_super_digest(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fixup_expands_auth_and_refuses_what_zookeeper_refuses() {
        let ann = digest("ann:pw");
        let ip = AuthId::ip("127.0.0.1".parse().expect("ip"));
        let fixed = fixup(&[acl(perms::ALL, "auth", "")], &[ip.clone(), ann.clone()]).expect("valid");
        assert_eq!(fixed, vec![acl(perms::ALL, "digest", &ann.id)]);
        assert_eq!(fixup(&[acl(perms::ALL, "auth", "")], &[ip]), Err(ErrorCode::InvalidAcl));
        for bad in [acl(1, "world", "someone"), acl(1, "nope", "x"), acl(1, "ip", "300.1.1.1"), acl(1, "digest", "x")] {
            assert_eq!(fixup(std::slice::from_ref(&bad), &[]), Err(ErrorCode::InvalidAcl), "{bad:?}");
        }
        assert_eq!(fixup(&[], &[]), Err(ErrorCode::InvalidAcl));
        let twice = [acl(1, "world", "anyone"), acl(1, "world", "anyone")];
        assert_eq!(fixup(&twice, &[]).expect("valid").len(), 1);
    }

    #[test]
    fn permissions_follow_the_entries() {
        let ann = digest("ann:pw");
        let local = AuthId::ip("127.0.0.1".parse().expect("ip"));
        let me = std::slice::from_ref(&local);
        let node = [acl(perms::READ, "world", "anyone"), acl(perms::ALL, "digest", &ann.id)];
        assert!(permits(&node, me, perms::READ));
        assert!(!permits(&node, me, perms::WRITE));
        assert!(permits(&node, &[local.clone(), ann], perms::WRITE));
        assert!(permits(&[acl(perms::ALL, "ip", "127.0.0.0/8")], me, perms::DELETE));
        assert!(!permits(&[acl(perms::ALL, "ip", "10.0.0.0/8")], me, perms::DELETE));
        assert!(permits(&[acl(perms::ALL, "ip", "127.0.0.1")], me, perms::DELETE));
        assert!(!permits(&[acl(0, "world", "anyone")], me, perms::READ));
        assert!(permits(&[], me, perms::ADMIN));
    }

    #[test]
    fn redaction_hides_hashes_only() {
        let shown = redacted(&[acl(1, "digest", "ann:RYbu6l5aZwqon8VWmkcGvezdzfc="), acl(1, "world", "anyone")]);
        assert_eq!(shown, vec![acl(1, "digest", "ann:x"), acl(1, "world", "anyone")]);
    }
}
