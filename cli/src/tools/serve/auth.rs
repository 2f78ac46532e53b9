//! `--web-config FILE`: the web configuration file of the Prometheus exporter-toolkit
//! (`--web.config.file` of node_exporter and the others), so the scrape configs, Secrets and
//! `htpasswd -B`/`mkpasswd` hashes a fleet already has for its exporters work here too:
//!
//! ```yaml
//! basic_auth_users:
//!   prometheus: $2y$10$...   # bcrypt
//! ```
//!
//! Only `basic_auth_users` is supported: `tls_server_config` is refused with a clear error
//! (TLS goes in front, or the network is fenced: deploy/ ships a NetworkPolicy), and unknown
//! keys are refused as exporter-toolkit refuses them (a typo must not silently leave the
//! endpoint open).
//!
//! bcrypt is slow by design (tens of ms at cost 10): credentials that verified once are
//! cached (as exporter-toolkit does, so a scrape every 15 s costs one string comparison), and at
//! most [`VERIFYING`] verifications run at once, off the event loop, so wrong passwords from
//! outside cost at most that many cores and never hold up the collectors' windows.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use base64::Engine as _;
use serde::Deserialize;
use tokio::sync::Semaphore;

/// Largest web config file read (a few users' hashes fit in a few hundred bytes).
const MAX_FILE: u64 = 1 << 20;
/// bcrypt verifications at once.
pub const VERIFYING: usize = 2;
/// Credentials remembered as verified (Prometheus servers × their users).
const CACHED: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("--web-config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: crate::host::HostError,
    },
    #[error("--web-config {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("--web-config {}: tls_server_config is not supported by tracekit serve: terminate TLS in front of it, or fence the port (deploy/networkpolicy.yaml)", path.display())]
    Tls { path: PathBuf },
    #[error("--web-config {}: user {user:?}: not a bcrypt hash ({message})", path.display())]
    Hash {
        path: PathBuf,
        user: String,
        message: String,
    },
    #[error("--web-config {}: basic_auth_users is empty: every request would be refused", path.display())]
    NoUsers { path: PathBuf },
}

/// The file's keys, as exporter-toolkit names them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    tls_server_config: Option<serde_norway::Value>,
    /// exporter-toolkit's HTTP/2 and response-header options: nothing to do for a server that
    /// speaks HTTP/1.1 and sends no extra headers, so accepted and ignored.
    #[serde(default)]
    #[allow(dead_code)]
    http_server_config: Option<serde_norway::Value>,
}

/// What `--web-config` asks for.
#[derive(Debug)]
pub struct WebConfig {
    /// user → bcrypt hash.
    users: BTreeMap<String, String>,
    /// (user, password) pairs that verified.
    verified: Mutex<Vec<(String, String)>>,
    verifying: Arc<Semaphore>,
    /// Verified when the user is unknown, so an unknown user takes as long as a wrong password
    /// (no user enumeration by timing): a hash at the first user's cost.
    dummy: String,
}

impl WebConfig {
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let bytes =
            crate::host::read_capped(path, MAX_FILE).map_err(|source| WebConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        WebConfig::parse(path, &String::from_utf8_lossy(&bytes))
    }

    pub fn parse(path: &Path, text: &str) -> Result<WebConfig, WebConfigError> {
        let p = || path.to_path_buf();
        // An empty file is an empty mapping (exporter-toolkit: no auth, no TLS), refused below.
        let f: File = if text.trim().is_empty() {
            File {
                basic_auth_users: None,
                tls_server_config: None,
                http_server_config: None,
            }
        } else {
            serde_norway::from_str(text).map_err(|e| WebConfigError::Parse {
                path: p(),
                message: e.to_string().replace('\n', " "),
            })?
        };
        if f.tls_server_config.is_some() {
            return Err(WebConfigError::Tls { path: p() });
        }
        let users = f.basic_auth_users.unwrap_or_default();
        if users.is_empty() {
            return Err(WebConfigError::NoUsers { path: p() });
        }
        let mut cost = bcrypt::DEFAULT_COST;
        for (i, (user, hash)) in users.iter().enumerate() {
            // Parses the hash without verifying anything: a typo fails here, not at the first
            // scrape.
            let parts: bcrypt::HashParts =
                hash.parse()
                    .map_err(|e: bcrypt::BcryptError| WebConfigError::Hash {
                        path: p(),
                        user: user.clone(),
                        message: e.to_string(),
                    })?;
            if i == 0 {
                cost = parts.get_cost();
            }
        }
        let dummy = bcrypt::hash_with_salt("tracekit: no such user", cost, [7u8; 16])
            .map(|h| h.to_string())
            .map_err(|e| WebConfigError::Hash {
                path: p(),
                user: String::new(),
                message: e.to_string(),
            })?;
        Ok(WebConfig {
            users,
            verified: Mutex::new(Vec::new()),
            verifying: Arc::new(Semaphore::new(VERIFYING)),
            dummy,
        })
    }

    /// Whether the value of an `Authorization` header (if any) names a user with the right
    /// password.
    pub async fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some((user, pass)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        let cached = |v: &Mutex<Vec<(String, String)>>| {
            v.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|(u, p)| *u == user && *p == pass)
        };
        if cached(&self.verified) {
            return true;
        }
        let hash = self
            .users
            .get(&user)
            .cloned()
            .unwrap_or_else(|| self.dummy.clone());
        let known = self.users.contains_key(&user);
        let Ok(permit) = Arc::clone(&self.verifying).acquire_owned().await else {
            return false;
        };
        let pw = pass.clone();
        // The permit moves into the blocking task: a client that hangs up does not free a slot
        // while its verification still runs.
        let ok = tokio::task::spawn_blocking(move || {
            let ok = bcrypt::verify(pw, &hash).unwrap_or(false);
            drop(permit);
            ok
        })
        .await
        .unwrap_or(false)
            && known;
        if ok {
            let mut v = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() >= CACHED {
                v.remove(0);
            }
            v.push((user, pass));
        }
        ok
    }
}

/// `Basic base64(user:password)` → (user, password).
fn basic_credentials(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, b64) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (u, p) = raw.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WebConfig, WebConfigError> {
        WebConfig::parse(Path::new("web.yml"), text)
    }

    fn header(user: &str, pass: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
        .into_bytes()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn parses_exporter_toolkit_files_and_refuses_the_rest() {
        let h = bcrypt::hash("s3cret", 4).unwrap();
        let c = parse(&format!("basic_auth_users:\n  prom: {h}\n")).unwrap();
        assert_eq!(c.users.len(), 1);
        // exporter-toolkit's http_server_config is accepted.
        parse(&format!(
            "http_server_config:\n  http2: false\nbasic_auth_users:\n  prom: '{h}'\n"
        ))
        .unwrap();
        let e = parse("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n").unwrap_err();
        assert!(
            e.to_string().contains("tls_server_config is not supported"),
            "{e}"
        );
        let e = parse("basic_auth_user:\n  prom: x\n").unwrap_err();
        assert!(e.to_string().starts_with("--web-config web.yml: "), "{e}");
        assert!(e.to_string().contains("basic_auth_user"), "{e}");
        let e = parse("basic_auth_users:\n  prom: plaintext\n").unwrap_err();
        assert!(
            e.to_string().contains("user \"prom\": not a bcrypt hash"),
            "{e}"
        );
        assert!(matches!(parse(""), Err(WebConfigError::NoUsers { .. })));
        assert!(matches!(
            parse("basic_auth_users: {}\n"),
            Err(WebConfigError::NoUsers { .. })
        ));
        let e = parse("basic_auth_users: [1, 2\n").unwrap_err();
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }

    #[test]
    fn only_the_right_password_passes_and_it_is_cached() {
        let h = bcrypt::hash("s3cret", 4).unwrap();
        let c = parse(&format!("basic_auth_users:\n  prom: {h}\n  other: {h}\n")).unwrap();
        block_on(async {
            assert!(!c.allows(None).await);
            assert!(!c.allows(Some(b"Bearer abc")).await);
            assert!(!c.allows(Some(b"Basic !!!")).await);
            assert!(!c.allows(Some(&header("prom", "wrong"))).await);
            assert!(!c.allows(Some(&header("nobody", "s3cret"))).await);
            assert!(!c.allows(Some(&header("prom", ""))).await);
            assert!(
                c.verified.lock().unwrap().is_empty(),
                "failures are not cached"
            );
            assert!(c.allows(Some(&header("prom", "s3cret"))).await);
            assert!(c.allows(Some(b"basic cHJvbTpzM2NyZXQ=")).await);
            assert_eq!(c.verified.lock().unwrap().len(), 1);
            assert!(c.allows(Some(&header("other", "s3cret"))).await);
            // A password with a colon: only the first colon separates the user.
            let h2 = bcrypt::hash("a:b", 4).unwrap();
            let c2 = parse(&format!("basic_auth_users:\n  u: '{h2}'\n")).unwrap();
            assert!(c2.allows(Some(&header("u", "a:b"))).await);
        });
    }
}
