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
    pub storage: &'a Storage,
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
    if !ctx.grants.storage_key(key) {
        return Err(denied(format!(
            "storage key {key:?} is not under a prefix granted to skill {} ({:?})",
            ctx.skill, ctx.grants.storage_prefixes
        )));
    }
    if function == HostFn::StorageGet {
        let value = ctx.storage.get(key).map_err(store_error)?;
        return Ok(json!({ "value": value.map(|v| String::from_utf8_lossy(&v).into_owned()) }));
    }
    let value = field(args, "value")?;
    ctx.storage.put(key, value.as_bytes()).map_err(store_error)?;
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
