//! Who calls the Flight SQL service: the users of the configuration file (`[[users]]`, each
//! with the SHA-256 of its password as ClickHouse's `password_sha256_hex`, and maybe read-only).
//!
//! Flight's handshake takes HTTP Basic credentials and answers a bearer token in its
//! `authorization` header, which later calls carry (Basic on every call is accepted too). An
//! interceptor checks every call, the handshake included, before any handler runs, and hands
//! the caller's [`Identity`] to the handlers in the request's extensions. With no users
//! configured the service is open, and every caller is a writer.
//!
//! A bearer token is also a session, as a clickhouse-client connection is one: what its
//! `SET` statements set lasts for its later calls ([`ClientSession`]). On an open service the
//! handshake still issues a token, for a client that wants a session.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::Engine;
use ring::rand::SecureRandom;
use serde::Deserialize;
use tonic::{Request, Status};

/// A user as the configuration file gives it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// The SHA-256 of the password, in hex (`echo -n PASSWORD | sha256sum`).
    pub password_sha256_hex: String,
    /// Refused every statement that writes (PERMISSION_DENIED).
    #[serde(default)]
    pub readonly: bool,
}

impl UserConfig {
    pub fn validate(users: &[UserConfig]) -> Result<(), String> {
        for (i, user) in users.iter().enumerate() {
            if user.name.is_empty() || user.name.contains(':') {
                return Err(format!("user {:?}: a name must be non-empty and without ':'", user.name));
            }
            if users[..i].iter().any(|u| u.name == user.name) {
                return Err(format!("user {:?} is listed twice", user.name));
            }
            if user.password_sha256_hex.len() != 64 || !user.password_sha256_hex.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(format!("user {:?}: password_sha256_hex must be 64 hex digits", user.name));
            }
        }
        Ok(())
    }
}

/// The caller of a request.
#[derive(Debug, Clone)]
pub struct Identity {
    pub user: Option<String>,
    pub readonly: bool,
    /// The session of the bearer token the call carries (none without one).
    pub session: Option<Arc<ClientSession>>,
}

/// What lasts across the calls of one bearer token: the settings its `SET` statements made.
#[derive(Debug, Default)]
pub struct ClientSession {
    settings: Mutex<BTreeMap<String, String>>,
}

impl ClientSession {
    pub fn settings(&self) -> BTreeMap<String, String> {
        self.settings.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Keeps what a statement of this session left set.
    pub fn keep(&self, settings: &BTreeMap<String, String>) {
        if let Ok(mut kept) = self.settings.lock() {
            kept.clone_from(settings);
        }
    }
}

impl Identity {
    /// Refuses a statement that writes to a read-only user.
    pub fn may_write(&self) -> Result<(), Status> {
        match (&self.user, self.readonly) {
            (Some(user), true) => {
                Err(Status::permission_denied(format!("user {user} is read-only: this statement writes")))
            }
            _ => Ok(()),
        }
    }

    /// The caller of `request`, as the interceptor found it (open access when none did).
    pub fn of<T>(request: &Request<T>) -> Identity {
        request.extensions().get::<Identity>().cloned().unwrap_or_else(Identity::anonymous)
    }

    /// A caller of an open service.
    pub fn anonymous() -> Identity {
        Identity { user: None, readonly: false, session: None }
    }

    /// The settings this caller's session has set (none without a session).
    pub fn settings(&self) -> BTreeMap<String, String> {
        self.session.as_ref().map(|s| s.settings()).unwrap_or_default()
    }

    /// Keeps a statement's settings in the caller's session, if it has one.
    pub fn keep(&self, settings: &BTreeMap<String, String>) {
        if let Some(session) = &self.session {
            session.keep(settings);
        }
    }
}

/// Tokens a server keeps at most; past it the oldest half is forgotten (those clients
/// hand-shake again).
const MAX_TOKENS: usize = 100_000;

pub struct Users {
    users: HashMap<String, UserConfig>,
    /// Bearer token → its identity, and when it was issued (for forgetting the oldest).
    tokens: Mutex<HashMap<String, (Identity, u64)>>,
    issued: std::sync::atomic::AtomicU64,
    random: ring::rand::SystemRandom,
}

impl Users {
    pub fn new(users: &[UserConfig]) -> Arc<Users> {
        Arc::new(Users {
            users: users.iter().map(|u| (u.name.clone(), u.clone())).collect(),
            tokens: Mutex::new(HashMap::new()),
            issued: Default::default(),
            random: ring::rand::SystemRandom::new(),
        })
    }

    pub fn is_open(&self) -> bool {
        self.users.is_empty()
    }

    /// The interceptor: the caller's identity into the request, or UNAUTHENTICATED.
    pub fn check(&self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = match request.metadata().get("authorization") {
            Some(header) => header,
            // An open service: a call without a token has no session.
            None if self.is_open() => return Ok(request),
            None => return Err(Status::unauthenticated("credentials needed: hand-shake with HTTP Basic credentials")),
        };
        let header = header.to_str().map_err(|_| Status::unauthenticated("the authorization header is not text"))?;
        let identity = if let Some(token) = header.strip_prefix("Bearer ") {
            let tokens = self.tokens.lock().map_err(|_| Status::internal("the tokens' lock"))?;
            tokens.get(token).map(|(identity, _)| identity.clone()).ok_or_else(|| {
                Status::unauthenticated("unknown or expired bearer token: hand-shake again with HTTP Basic credentials")
            })?
        } else if self.is_open() {
            // Any other credentials are nobody's on an open service.
            Identity::anonymous()
        } else if let Some(basic) = header.strip_prefix("Basic ") {
            self.basic(basic)?
        } else {
            return Err(Status::unauthenticated("the authorization header must be Basic or Bearer"));
        };
        request.extensions_mut().insert(identity);
        Ok(request)
    }

    fn basic(&self, encoded: &str) -> Result<Identity, Status> {
        let refused = || Status::unauthenticated("wrong user name or password");
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| refused())?;
        let decoded = String::from_utf8(decoded).map_err(|_| refused())?;
        let (name, password) = decoded.split_once(':').ok_or_else(refused)?;
        let user = self.users.get(name).ok_or_else(refused)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, password.as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        if !hex.eq_ignore_ascii_case(&user.password_sha256_hex) {
            return Err(refused());
        }
        Ok(Identity { user: Some(user.name.clone()), readonly: user.readonly, session: None })
    }

    /// A new bearer token for `identity`, with a session of its own.
    pub fn issue(&self, identity: Identity) -> Result<String, Status> {
        let identity = Identity { session: Some(Arc::default()), ..identity };
        let mut bytes = [0u8; 32];
        self.random.fill(&mut bytes).map_err(|_| Status::internal("no randomness for a token"))?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let at = self.issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tokens = self.tokens.lock().map_err(|_| Status::internal("the tokens' lock"))?;
        if tokens.len() >= MAX_TOKENS {
            let cutoff = at.saturating_sub(MAX_TOKENS as u64 / 2);
            tokens.retain(|_, (_, issued)| *issued >= cutoff);
        }
        tokens.insert(token.clone(), (identity, at));
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Arc<Users> {
        // sha256("secret")
        let hash = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b".to_string();
        Users::new(&[
            UserConfig { name: "alice".into(), password_sha256_hex: hash.clone(), readonly: false },
            UserConfig { name: "reader".into(), password_sha256_hex: hash, readonly: true },
        ])
    }

    fn with_header(value: &str) -> Request<()> {
        let mut request = Request::new(());
        request.metadata_mut().insert("authorization", value.parse().expect("header"));
        request
    }

    fn basic(user: &str, password: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
    }

    #[test]
    fn basic_credentials_give_a_token_that_later_calls_carry() {
        let users = users();
        let checked = users.check(with_header(&basic("reader", "secret"))).expect("right password");
        let identity = Identity::of(&checked);
        assert_eq!((identity.user.as_deref(), identity.readonly), (Some("reader"), true));
        assert_eq!(identity.may_write().expect_err("read-only").code(), tonic::Code::PermissionDenied);
        let token = users.issue(identity.clone()).expect("token");
        let later = Identity::of(&users.check(with_header(&format!("Bearer {token}"))).expect("token accepted"));
        assert_eq!((later.user.as_deref(), later.readonly), (Some("reader"), true));
        // The token's calls share one session: what one sets, the next sees.
        later.keep(&BTreeMap::from([("max_threads".to_string(), "1".to_string())]));
        let again = Identity::of(&users.check(with_header(&format!("Bearer {token}"))).expect("token accepted"));
        assert_eq!(again.settings().get("max_threads").map(String::as_str), Some("1"));
        assert!(identity.settings().is_empty(), "a call with Basic credentials has no session");
    }

    #[test]
    fn wrong_or_missing_credentials_are_unauthenticated() {
        let users = users();
        for request in [
            Request::new(()),
            with_header(&basic("alice", "wrong")),
            with_header(&basic("nobody", "secret")),
            with_header("Bearer 0123"),
            with_header("Digest x"),
        ] {
            assert_eq!(users.check(request).expect_err("refused").code(), tonic::Code::Unauthenticated);
        }
        assert!(Users::new(&[]).check(Request::new(())).is_ok(), "no users: open");
    }

    #[test]
    fn the_configured_users_are_validated() {
        let user = |name: &str, hash: &str| UserConfig {
            name: name.into(),
            password_sha256_hex: hash.into(),
            readonly: false,
        };
        let hash = "a".repeat(64);
        assert!(UserConfig::validate(&[user("a", &hash)]).is_ok());
        assert!(UserConfig::validate(&[user("a", "abc")]).is_err());
        assert!(UserConfig::validate(&[user("a", &hash), user("a", &hash)]).is_err());
        assert!(UserConfig::validate(&[user("a:b", &hash)]).is_err());
    }
}
