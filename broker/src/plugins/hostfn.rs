//! The host functions the broker serves while a call runs: each checks the
//! call's grants, then acts. Arguments and answers are JSON; a refusal is a
//! `HostFnError` with a stable kind.

use super::http::{self, FetchError, FetchRequest};
use super::store::{Secrets, Storage, StoreError};
use crate::egress::connect;
use crate::egress::refusal::Refusal;
use palisade_policy::{EgressPlan, PluginGrants};
use palisade_protocol::plugin::{HostFn, HostFnError};
use palisade_protocol::wire::ErrorKind;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Longest message `log` records; the rest is cut.
pub const MAX_LOG_BYTES: usize = 4096;

/// What a call's host functions act on.
pub struct CallContext<'a> {
    pub skill: &'a str,
    pub grants: &'a PluginGrants,
    pub secrets: &'a Secrets,
    /// The requester's storage of this skill, when the call is granted storage.
    pub storage: Option<&'a Storage>,
    /// The checks `http_fetch` passes, as strict egress's: the granted
    /// hosts, `[egress] ports`, `hosts` and `allow_addresses`.
    pub egress: &'a EgressPlan,
    pub deadline: Instant,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> HostFnError {
    HostFnError { kind, message: message.into() }
}

fn denied(message: String) -> HostFnError {
    err(ErrorKind::CapabilityDenied, message)
}

fn field<'v>(args: &'v Value, name: &str) -> Result<&'v str, HostFnError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| err(ErrorKind::InvalidRequest, format!("argument {name:?} (a string) is missing")))
}

fn store_error(e: StoreError) -> HostFnError {
    match e {
        StoreError::Quota { .. } | StoreError::TooLarge { .. } => {
            err(ErrorKind::QuotaExceeded, e.to_string())
        }
        StoreError::BadKey(_) => err(ErrorKind::InvalidRequest, e.to_string()),
        other => err(ErrorKind::RuntimeFailure, other.to_string()),
    }
}

/// Serves one host function call, within the call's deadline.
pub async fn serve(ctx: &CallContext<'_>, function: HostFn, args: &[u8]) -> Result<Vec<u8>, HostFnError> {
    let now = Instant::now();
    if now >= ctx.deadline {
        return Err(err(ErrorKind::TimedOut, "the call's deadline has passed"));
    }
    let args: Value = serde_json::from_slice(args).map_err(|e| {
        err(ErrorKind::InvalidRequest, format!("{}: arguments are not JSON: {e}", function.name()))
    })?;
    let answer = match tokio::time::timeout_at(ctx.deadline, dispatch(ctx, function, &args)).await {
        Ok(answer) => answer?,
        Err(_) => {
            return Err(err(
                ErrorKind::TimedOut,
                format!("{} ran past the call's deadline", function.name()),
            ));
        }
    };
    Ok(answer.to_string().into_bytes())
}

async fn dispatch(ctx: &CallContext<'_>, function: HostFn, args: &Value) -> Result<Value, HostFnError> {
    match function {
        HostFn::SecretGet => {
            let key = field(args, "key")?;
            if !ctx.grants.secrets.iter().any(|k| k == key) {
                return Err(denied(format!("secret {key:?} is not granted to skill {}", ctx.skill)));
            }
            match ctx.secrets.get(key).map_err(store_error)? {
                Some(v) => Ok(json!({ "value": String::from_utf8_lossy(&v) })),
                None => Err(err(ErrorKind::RuntimeFailure, format!("no secret {key:?} is set"))),
            }
        }
        HostFn::StorageGet | HostFn::StoragePut => storage(ctx, function, args),
        HostFn::Log => {
            let level = args.get("level").and_then(Value::as_str).unwrap_or("info");
            let mut message = field(args, "message")?.to_string();
            if message.len() > MAX_LOG_BYTES {
                let mut cut = MAX_LOG_BYTES;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            tracing::info!(skill = ctx.skill, level, "plugin: {message}");
            Ok(json!({}))
        }
        HostFn::HttpFetch => fetch(ctx, args).await,
    }
}

fn storage(ctx: &CallContext<'_>, function: HostFn, args: &Value) -> Result<Value, HostFnError> {
    let key = field(args, "key")?;
    let store = match ctx.storage {
        Some(store) if ctx.grants.storage_key(key) => store,
        _ => {
            return Err(denied(format!(
                "storage key {key:?} is not under a prefix granted to skill {} ({:?})",
                ctx.skill, ctx.grants.storage_prefixes
            )));
        }
    };
    if function == HostFn::StorageGet {
        let value = store.get(key).map_err(store_error)?;
        return Ok(json!({ "value": value.map(|v| String::from_utf8_lossy(&v).into_owned()) }));
    }
    let value = field(args, "value")?;
    store.put(key, value.as_bytes()).map_err(store_error)?;
    Ok(json!({}))
}

async fn fetch(ctx: &CallContext<'_>, args: &Value) -> Result<Value, HostFnError> {
    let req: FetchRequest = serde_json::from_value(args.clone())
        .map_err(|e| err(ErrorKind::InvalidRequest, format!("http_fetch: {e}")))?;
    let fetch_error = |e: FetchError| match e {
        FetchError::TooLarge => err(ErrorKind::QuotaExceeded, e.to_string()),
        FetchError::BadUrl(_) | FetchError::BadMethod(_) | FetchError::BadHeader(_) => {
            err(ErrorKind::InvalidRequest, e.to_string())
        }
        _ => err(ErrorKind::RuntimeFailure, e.to_string()),
    };
    let url = http::parse_url(&req.url).map_err(fetch_error)?;
    if !ctx.grants.http_host(&url.host) {
        return Err(denied(format!("host {} is not granted to skill {}", url.host, ctx.skill)));
    }
    let (mut stream, address) =
        connect::open(ctx.egress, &url.host, url.port).await.map_err(|r| match r {
            Refusal::ResolveFailed { .. } | Refusal::ConnectFailed { .. } => {
                err(ErrorKind::RuntimeFailure, r.to_string())
            }
            other => denied(other.to_string()),
        })?;
    tracing::debug!(skill = ctx.skill, host = %url.host, %address, "http_fetch");
    let response = http::exchange(&mut stream, &url, &req).await.map_err(fetch_error)?;
    serde_json::to_value(response).map_err(|e| err(ErrorKind::RuntimeFailure, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(function: HostFn, args: &str, deadline: Instant) -> Result<Value, HostFnError> {
        let dir = std::env::temp_dir().join(format!("palisade-hostfn-{}-{:?}", std::process::id(), function));
        let _ = std::fs::remove_dir_all(&dir);
        let secrets = Secrets { dir: dir.join("secrets") };
        secrets.set("granted", b"yes").unwrap();
        secrets.set("other", b"no").unwrap();
        let storage = Storage::new(dir.join("storage"), 1000, "t", 64).unwrap();
        let grants = PluginGrants {
            http_hosts: vec!["granted.test".into(), "127.0.0.1".into()],
            secrets: vec!["granted".into()],
            storage_prefixes: vec!["notes/".into()],
            log: true,
        };
        let egress = super::super::egress_plan(&grants, &palisade_policy::config::EgressConfig::default());
        let ctx = CallContext {
            skill: "t",
            grants: &grants,
            secrets: &secrets,
            storage: Some(&storage),
            egress: &egress,
            deadline,
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(serve(&ctx, function, args.as_bytes()));
        let _ = std::fs::remove_dir_all(&dir);
        out.map(|bytes| serde_json::from_slice(&bytes).unwrap())
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn host_functions_keep_to_the_grants() {
        assert_eq!(run(HostFn::SecretGet, r#"{"key":"granted"}"#, later()).unwrap(), json!({"value": "yes"}));
        let e = run(HostFn::SecretGet, r#"{"key":"other"}"#, later()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied);
        assert!(!e.message.contains("no\""));
        let e = run(HostFn::StoragePut, r#"{"key":"cache/x","value":"1"}"#, later()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied);
        assert_eq!(run(HostFn::StoragePut, r#"{"key":"notes/x","value":"1"}"#, later()).unwrap(), json!({}));
        let big = format!(r#"{{"key":"notes/y","value":"{}"}}"#, "x".repeat(100));
        assert_eq!(run(HostFn::StoragePut, &big, later()).unwrap_err().kind, ErrorKind::QuotaExceeded);
        assert_eq!(run(HostFn::StorageGet, r#"{"key":"notes/z"}"#, later()).unwrap(), json!({"value": null}));
        let e = run(HostFn::HttpFetch, r#"{"url":"http://other.test/"}"#, later()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied);
        let e = run(HostFn::HttpFetch, r#"{"url":"https://granted.test/"}"#, later()).unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::RuntimeFailure, "https is not supported by http_fetch yet")
        );
        // A granted host at a loopback address is refused as strict egress refuses it.
        let e = run(HostFn::HttpFetch, r#"{"url":"http://127.0.0.1/"}"#, later()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied);
        assert!(e.message.contains("refused addresses"), "{}", e.message);
        assert_eq!(run(HostFn::Log, r#"{"level":"info","message":"hi"}"#, later()).unwrap(), json!({}));
        let e = run(HostFn::SecretGet, "not json", later()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
    }

    #[test]
    fn a_host_call_past_the_deadline_is_timed_out() {
        let past = Instant::now();
        let e = run(HostFn::Log, r#"{"message":"late"}"#, past).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TimedOut);
    }
}
